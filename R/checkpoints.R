#' Restore the latest checkpoint, or build a fresh model
#'
#' Fault tolerance for long training runs, as in the distributed-training
#' guide: when `checkpoint_dir` holds models written by
#' [checkpoint_callbacks()] (`ckpt-<epoch>.keras`), the newest one is loaded,
#' compiled as it was saved; otherwise `build_fn()` builds and compiles a new
#' model. Call it inside a strategy's scope (`with(strategy$scope(), ...)`)
#' so the model's variables are mirrored. A checkpoint that cannot be read
#' is skipped with a warning (class `multigpu_warning`).
#'
#' @param checkpoint_dir Directory of the checkpoints (`~` is expanded).
#' @param build_fn An R function of no arguments that returns a new,
#'   compiled Keras model; called when there is nothing to restore.
#' @returns A compiled Keras model: the newest checkpoint, or `build_fn()`'s.
#' @family checkpoints
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' build_model <- function() {
#'   model <- keras_model_sequential(input_shape = 4) |>
#'     layer_dense(1)
#'   model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#'   model
#' }
#' checkpoint_dir <- file.path(tempdir(), "ckpt")
#' strategy <- mirrored_strategy()
#' with(strategy$scope(), {
#'   model <- make_or_restore_model(checkpoint_dir, build_model)
#' })
#' x <- matrix(runif(400), ncol = 4)
#' # shuffle = FALSE: a resumed run sees the batches an uninterrupted one would
#' model |> fit(x, rowSums(x), epochs = 2, verbose = 0, shuffle = FALSE,
#'              callbacks = checkpoint_callbacks(checkpoint_dir))
#' list.files(checkpoint_dir)
#'
#' # Run again: the newest checkpoint is restored, not a new model built
#' with(strategy$scope(), {
#'   model <- make_or_restore_model(checkpoint_dir, build_model)
#' })
make_or_restore_model <- function(checkpoint_dir, build_fn) {
  call_core("make_or_restore_model", as_path(checkpoint_dir),
            build_fn = build_fn)
}

#' Callbacks that checkpoint training and resume it after a crash
#'
#' Two Keras callbacks, crash-safe (every file is written under a temporary
#' name and renamed into place): a backup callback keeps the training state
#' (weights, optimizer, random-generator states and the step reached) in
#' `checkpoint_dir/backup`, so running the same `fit()` again after a failure
#' resumes at the step after the last checkpoint, skipping the batches of the
#' interrupted epoch already trained; with data whose order depends only on
#' the epoch (unshuffled, or [distributed_dataset()] with a `seed`, given as
#' `data`) it ends with the weights of an uninterrupted run. A model
#' checkpoint callback writes full models,
#' `ckpt-<epoch>.keras`, that [make_or_restore_model()] restores (the newest
#' by epoch and batch, not by file time). A corrupt backup file is skipped
#' with a warning; a full disk gives a classed error and keeps the committed
#' checkpoints. In multi-worker training only the chief writes.
#'
#' A job warned before its time limit stops cleanly: when `preemption_signal`
#' arrives during `fit()` (Slurm sends it with `sbatch --signal=B:USR1@90`),
#' the batch in progress ends, the training state is saved after it, a Slurm
#' job submitted with `--requeue` requeues itself (`scontrol requeue`), and
#' R exits with status 75 and a message saying how training resumes. The
#' requeued job runs the same script, which resumes at that batch; see the
#' cluster guide for the `#SBATCH` lines. A warning that arrives after
#' `fit()` has returned is reported and ends nothing: the script goes on
#' (to save the final model, say) until the job's time limit.
#'
#' @param checkpoint_dir Directory for the checkpoints, created if missing
#'   (`~` is expanded); it must be writable.
#' @param save_freq `"epoch"` to checkpoint after every epoch, or a whole
#'   number N to checkpoint every N batches (and at every epoch end).
#' @param max_to_keep How many of the newest `ckpt-*.keras` models to keep,
#'   a whole number >= 1, or `NULL` to keep them all.
#' @param data The training dataset, or `NULL`. A [distributed_dataset()]
#'   with `shuffle = TRUE` and a `seed` counts its own epochs; given here, it
#'   is told each epoch, so a resumed epoch is shuffled as the interrupted
#'   one was ([fit_distributed()] gives its dataset itself).
#' @param preemption_signal The signal a scheduler sends before it stops the
#'   job, by name (`"SIGUSR1"` or `"USR1"`) or number, or `NULL` to leave
#'   it alone. Multi-worker jobs stop together after the same batch.
#' @returns A list of two Keras callbacks, for `fit(callbacks = )`.
#' @family checkpoints
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' checkpoint_dir <- file.path(tempdir(), "ckpt-every-10")
#' callbacks <- checkpoint_callbacks(checkpoint_dir, save_freq = 10, max_to_keep = 2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(1)
#' model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_adam())
#' x <- matrix(runif(800), ncol = 4)
#' model |> fit(x, rowSums(x), batch_size = 10, epochs = 2, verbose = 0,
#'              shuffle = FALSE, callbacks = callbacks)
#' list.files(checkpoint_dir)   # the 2 newest models, and the state to resume from
checkpoint_callbacks <- function(checkpoint_dir, save_freq = "epoch",
                                 max_to_keep = 3L, data = NULL,
                                 preemption_signal = "SIGUSR1") {
  call_core("checkpoint_callbacks", as_path(checkpoint_dir),
            save_freq = if (is.character(save_freq)) save_freq else as_count(save_freq),
            max_to_keep = as_count(max_to_keep), data = data,
            preemption_signal = if (is.numeric(preemption_signal))
              as_count(preemption_signal) else preemption_signal)
}
