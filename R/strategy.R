#' A mirrored strategy over several devices
#'
#' Synchronous data parallelism with `tf.distribute`: the model's variables
#' are mirrored on every device and kept in sync after each batch. Create
#' (and compile) the model inside the strategy's scope, then train as usual:
#'
#' ```r
#' strategy <- mirrored_strategy()
#' with(strategy$scope(), {
#'   model <- build_model()
#'   model |> compile(loss = "mse", optimizer = "adam")
#' })
#' model |> fit(dataset, epochs = 2)
#' ```
#'
#' `devices` is read exactly like `gpus` in [multi_gpu_model()] (one
#' number is a count, two or more numbers are GPU ids, strings are device
#' names), and resolved by the same Python resolver. Asking again for the
#' same devices returns the same strategy.
#'
#' @param devices `NULL` for every GPU (every logical CPU device on a machine
#'   without GPU, see [virtual_devices()]), one number >= 2, a vector of GPU
#'   ids, or device names such as `c("/cpu:0", "/cpu:1")`.
#' @param cross_device_ops How gradients are all-reduced: `NULL` (TensorFlow
#'   chooses), `"nccl"`, `"hierarchical_copy"`, `"reduce_to_one"`, or a
#'   `tf$distribute$CrossDeviceOps` object.
#' @returns A `tf$distribute$MirroredStrategy` (a Python object): use
#'   `strategy$scope()` with [with()], and `strategy$num_replicas_in_sync`.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' strategy <- mirrored_strategy()
#' strategy$num_replicas_in_sync
#' with(strategy$scope(), {
#'   model <- keras_model_sequential(input_shape = 4) |>
#'     layer_dense(1)
#'   model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#' })
#' x <- matrix(runif(400), ncol = 4)
#' dataset <- list(x, rowSums(x)) |>
#'   tfdatasets::tensor_slices_dataset() |>
#'   tfdatasets::dataset_batch(32)
#' model |> fit(dataset, epochs = 2, verbose = 0)
mirrored_strategy <- function(devices = NULL, cross_device_ops = NULL) {
  call_core("mirrored_strategy",
            devices = as_device_list(devices),
            cross_device_ops = cross_device_ops)
}

#' A strategy over several machines (workers)
#'
#' Synchronous data parallelism across processes, usually on several
#' machines: every worker holds a copy of the model, takes its share of each
#' global batch, and the gradients are all-reduced between all workers
#' (`tf$distribute$MultiWorkerMirroredStrategy`). The same script runs on
#' every worker; train with [fit_distributed()] (Keras's `fit()` cannot run
#' under this strategy):
#'
#' ```r
#' strategy <- multi_worker_strategy()
#' with(strategy$scope(), {
#'   model <- build_model()
#'   model |> compile(loss = "mse", optimizer = "adam")
#' })
#' data <- distributed_dataset(x, y, per_replica_batch_size = 64,
#'                             strategy = strategy)
#' model |> fit_distributed(data, epochs = 10)
#' ```
#'
#' The workers find each other through what the cluster manager sets, in
#' this order:
#'
#' 1. `TF_CONFIG`: Kubernetes (a Kubeflow TFJob), Vertex AI, or, on one
#'    machine, `python -m multigpu.launch --workers 2 -- Rscript train.R`.
#' 2. A Slurm job step with more than one task, as started by
#'    `srun Rscript train.R` (through TensorFlow's `SlurmClusterResolver`; on
#'    GPU nodes each task gets its share of the node's GPUs, so call
#'    `multi_worker_strategy()` before anything else uses TensorFlow).
#' 3. Otherwise this process is the only worker; a warning says so when the
#'    environment looks like one task of a job that it cannot join (a Slurm
#'    job with several tasks run without `srun`, say).
#'
#' The variables are read from R's environment when `multi_worker_strategy()`
#' is called, so `Sys.setenv(TF_CONFIG = ...)` before the call works.
#' Creating the strategy waits until every worker has joined. A process has
#' one such strategy: calling again returns the same one.
#' `strategy$cluster_resolver$task_id` is this worker's index; worker 0 is
#' the chief. See `vignette("distributed-training")` for a Slurm batch
#' script and a Kubernetes manifest.
#'
#' @returns A `tf$distribute$MultiWorkerMirroredStrategy` (a Python object):
#'   use `strategy$scope()` with [with()]; `strategy$num_replicas_in_sync` is
#'   the number of replicas over all workers.
#' @family multi-device training
#' @export
#' @examples
#' \dontrun{
#' # In a script run once per worker, e.g. `srun -n 2 Rscript train.R`:
#' strategy <- multi_worker_strategy()
#' strategy$num_replicas_in_sync
#' }
multi_worker_strategy <- function() {
  start_core_for_configuration()
  # Python copied the environment when it started; pass on what R sees now
  # (Sys.setenv(TF_CONFIG = ...) after Python started, say).
  cluster <- reticulate::import("multigpu.cluster.resolver", convert = FALSE)
  with_python(cluster$use_environment(as.list(Sys.getenv())))
  call_core("multi_worker_strategy")
}

#' Train under a strategy with `strategy$run()`
#'
#' A `fit()` for any strategy: each step runs the model's compiled training
#' step on every replica's share of the global batch, and the gradients are
#' all-reduced. Under [mirrored_strategy()] `fit()` does the same; use
#' `fit_distributed()` where Keras's `fit()` cannot run, such as a
#' multi-worker strategy.
#'
#' @param object A Keras model built and compiled under the strategy's
#'   scope.
#' @param dataset A dataset batched at the global batch size, as from
#'   [distributed_dataset()].
#' @param epochs The epoch to stop after, a whole number.
#' @param strategy The strategy; `NULL` for the one the model was built
#'   under.
#' @param verbose `"auto"`, `0`, `1` or `2`, as in
#'   [fit()][keras3::fit.keras.src.models.model.Model].
#' @param callbacks A list of Keras callbacks, such as
#'   [checkpoint_callbacks()].
#' @param initial_epoch The epoch to start at, 1-based.
#' @returns A training history, as from
#'   [fit()][keras3::fit.keras.src.models.model.Model], invisibly.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' strategy <- mirrored_strategy()
#' with(strategy$scope(), {
#'   model <- keras_model_sequential(input_shape = 4) |>
#'     layer_dense(1)
#'   model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#' })
#' x <- matrix(runif(400), ncol = 4)
#' data <- distributed_dataset(x, rowSums(x), per_replica_batch_size = 25,
#'                             strategy = strategy)
#' model |> fit_distributed(data, epochs = 2, verbose = 0)
fit_distributed <- function(object, dataset, epochs = 1L, strategy = NULL,
                            verbose = "auto", callbacks = NULL,
                            initial_epoch = 1L) {
  history <- call_core("fit_distributed", check_model(object), dataset,
                       epochs = as_count(epochs, null_ok = FALSE),
                       strategy = strategy, verbose = as_verbose(verbose),
                       callbacks = as_callbacks(callbacks),
                       initial_epoch = as_epoch_index(initial_epoch))
  invisible(as_training_history(history))
}
