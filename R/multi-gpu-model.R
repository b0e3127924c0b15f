#' Replicates a model on different GPUs
#'
#' Single-machine data parallelism: every batch is divided into one sub-batch
#' per device, a replica of `model` runs on each device (forward and backward
#' pass), and the outputs are concatenated into one batch. With a batch of 64
#' and `gpus = 2`, each device processes 32 samples. The replicas share the
#' template's weights, so training the returned model trains `model`.
#'
#' On a machine without GPUs the replicas run on logical CPU devices: call
#' [virtual_devices()] before building a model to simulate several.
#'
#' @section How `gpus` is read:
#' * `NULL`: every GPU; without GPUs, every logical CPU device (with a
#'   one-time warning).
#' * One number, e.g. `gpus = 2`: that many devices.
#' * A numeric vector of two or more, e.g. `gpus = c(0, 1)`: GPU *ids*.
#' * A character vector, e.g. `gpus = c("/gpu:0", "/gpu:1")` or
#'   `c("/cpu:0", "/cpu:1")`: device names.
#' * A list, e.g. `list(0, 2)` or `list("/cpu:0", "/cpu:1")`: always ids or
#'   names, whatever its length.
#'
#' Numbers are sent to Python as integers. `NA`, `NaN`, negative and
#' non-whole numbers are rejected in R; the Python core judges everything
#' else (a count below 2, ids or names this machine does not have) and its
#' message says what the machine has.
#'
#' **The `gpus = c(3)` trap.** R has no scalars: `c(3)` *is* `3`. The
#' original R wrapper therefore read `gpus = c(3)`, meant as "the GPU with
#' id 3", as "three GPUs", and so does this one: one number is always a
#' count. To name devices use two or more ids (`c(2, 3)`), a list
#' (`list(3)`, which the core rejects because one device is not data
#' parallelism), or device names.
#'
#' @section How `engine = "auto"` chooses:
#' On logical CPU devices the replicate engine is the measured winner:
#' transfers between them are references, and it runs at about plain Keras's
#' speed where the mirrored engine ran 4-6 times slower. On GPUs the choice
#' follows the bytes a training step moves: the replicate engine's first
#' device sends `n - 1` copies of the weights and receives `n - 1` copies of
#' the gradients, the mirrored engine's all-reduce moves `2 (n - 1) / n`
#' copies per device, so from 3 GPUs on the mirrored engine is the predicted
#' winner (the package's `docs/benchmarks.md`). `cpu_merge = FALSE`, or a
#' model the mirrored engine cannot copy, keeps the replicate engine, with a
#' warning that says why. The returned model's `$engine` and
#' `$engine_reason` say which engine runs and why.
#'
#' @section Batch statistics:
#' BatchNormalization is the one layer whose training step depends on the
#' rows it sees together. On the TensorFlow backend, by default
#' (`sync_batchnorm = NULL`, read as `FALSE`), every replica normalises its
#' own share: with a batch of 8 on 4 devices each layer normalises over 2
#' rows, and the moving statistics follow those small shares. This is cheap
#' and is what the original function did; it is fine when each device gets
#' dozens of rows. `sync_batchnorm = TRUE` pools the statistics over the
#' whole batch: choose it for small per-device batches, or when the result
#' must match training on one device. The package's `docs/benchmarks.md`
#' gives its measured cost. On the JAX backend the statistics are always the
#' whole batch's (`NULL` is read as `TRUE` there, and `FALSE` is refused).
#'
#' @section On the JAX backend:
#' After `keras3::use_backend("jax")` (before keras3 starts Python) the call
#' is the same, with the same `gpus` forms and the same errors. One engine
#' runs there, `"jax"`: the template's weights are kept on every device and
#' XLA splits each whole batch across the devices inside the compiled
#' training step, unevenly when the rows do not divide (the last batch of an
#' epoch, or fewer rows than devices), with the template's numbers. So
#' `engine` is `"auto"` or `"jax"`, `cpu_merge = FALSE` (XLA gathers the
#' outputs; there is no merge to place), `cpu_relocation = TRUE` (the
#' weights live on every device) and `sync_batchnorm = FALSE` are refused,
#' each with the reason. The returned model has `$template`, `$devices`,
#' `$engine` and `$engine_reason`. Call [virtual_devices()] before building
#' a model, as on TensorFlow: JAX fixes its number of devices when it starts.
#'
#' @section Losses added by layers, and models with steps of their own:
#' Layers may add losses while they run (`activity_regularizer`, or
#' `self$add_loss()` in a custom layer's `call`, as a variational
#' autoencoder's sampling layer does). Each replica adds its layers' losses on
#' its share of the batch, and they are combined weighting every replica by
#' its share of the rows: the whole batch's value for a loss that is a mean
#' over the rows or does not depend on them. A loss that sums over the rows
#' should be divided by them, as Keras does for its own.
#'
#' A model whose class defines its own `train_step`, `test_step`,
#' `predict_step`, `compute_loss` or `compute_metrics` is refused with an
#' error naming them: the engines run Keras's standard steps. Build, compile
#' and `fit()` such a model inside `with(mirrored_strategy()$scope(), ...)`
#' instead, where Keras runs its own steps on every device.
#'
#' A layer written in R (keras3's `Layer()`, `new_layer_class()`, or
#' `layer_lambda()` over an R function) runs on the replicate engine, which
#' traces every replica on R's main thread; the mirrored engine, which
#' traces each replica in a thread of its own where R cannot run, refuses
#' it, and `engine = "auto"` keeps the replicate engine.
#'
#' @section Model saving:
#' `save_model_hdf5()`, `save_model_weights_hdf5()` and `load_model_weights_hdf5()`
#' (and Keras checkpoint callbacks) act on the template model when given the
#' returned model, so saving either one writes the same file: a plain Keras
#' model that loads on any machine, with or without multigpu. With
#' `cpu_relocation = TRUE` the template is a CPU copy of `model`: save the
#' returned model (or `parallel_model$template`), not `model`.
#'
#' @param model A Keras model, the "template": Sequential, functional, or
#'   subclassed, built (with an input layer, or called once on a batch). To
#'   keep its weights in host memory, build it under
#'   `with(tf$device("/cpu:0"), { ... })`.
#' @param gpus `NULL` to use all available GPUs (default); one number >= 2
#'   for that many devices; a vector of two or more GPU ids; or device
#'   names. See "How `gpus` is read".
#' @param cpu_merge `TRUE` (default) to slice batches and concatenate the
#'   outputs on the CPU; `FALSE` to do it on the first device (for GPUs
#'   joined by NVLink).
#' @param cpu_relocation `TRUE` to rebuild the model's weights on the CPU
#'   (keeping their values), for a model that was not built under a CPU
#'   device scope.
#' @param engine `"auto"` (default) for the engine the numbers favour on the
#'   devices at hand: `"replicate"` on logical CPU devices and on 2 GPUs,
#'   `"mirrored"` on 3 or more GPUs (see "How `engine = "auto"` chooses");
#'   `"replicate"` (slice each batch between replicas of the template, as
#'   described above); or `"mirrored"` (train a copy of the template under a
#'   mirrored strategy, copying the weights back to the template). On the
#'   JAX backend `"auto"` or `"jax"` (see "On the JAX backend").
#' @param sync_batchnorm `NULL` (default): the backend's choice, `FALSE` on
#'   TensorFlow and `TRUE` on JAX. `FALSE`: each replica's
#'   BatchNormalization layers compute their batch statistics over its own
#'   share of the batch, as the original `multi_gpu_model()` did
#'   (TensorFlow only). `TRUE`: over the whole batch, so one training step
#'   equals the template's step on that batch, moving statistics included,
#'   at the cost, on TensorFlow, of pooling the statistics of every
#'   BatchNormalization layer in every step (see "Batch statistics"). With
#'   `engine = "replicate"` the model must be functional or sequential;
#'   `engine = "auto"` runs the mirrored engine for a subclassed one, with a
#'   warning.
#' @returns A Keras model (a Python `ParallelModel`, `MirroredModel` for
#'   the mirrored engine, or `ShardedModel` on the JAX backend) used just
#'   like `model`:
#'   [compile()][keras3::compile.keras.src.models.model.Model],
#'   [fit()][keras3::fit.keras.src.models.model.Model],
#'   [evaluate()][keras3::evaluate.keras.src.models.model.Model],
#'   [predict()][keras3::predict.keras.src.models.model.Model]. It has
#'   `$template` (the model whose weights the replicas share), `$devices`,
#'   `$engine`, `$engine_reason` and (replicate engine)
#'   `$batch_split(batch_size)`.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)   # no GPU: simulate 2 devices, before any model exists
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(8, activation = "relu") |>
#'   layer_dense(1)
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' parallel_model$devices
#' parallel_model$batch_split(64)   # 32 rows per device
#' parallel_model |> compile(loss = loss_mean_squared_error(),
#'                           optimizer = optimizer_rmsprop())
#' x <- matrix(runif(256), ncol = 4)
#' history <- parallel_model |> fit(x, rowSums(x), epochs = 2, verbose = 0)
#' history
#'
#' # A tfdatasets dataset: each batch of 32 is split into 2 sub-batches of 16
#' dataset <- list(x, rowSums(x)) |>
#'   tfdatasets::tensor_slices_dataset() |>
#'   tfdatasets::dataset_batch(32)
#' parallel_model |> evaluate(dataset, verbose = 0)
multi_gpu_model <- function(model, gpus = NULL, cpu_merge = TRUE,
                            cpu_relocation = FALSE, engine = "auto",
                            sync_batchnorm = NULL) {
  call_core("multi_gpu_model", check_model(model),
            gpus = as_device_list(gpus),
            cpu_merge = as_flag(cpu_merge),
            cpu_relocation = as_flag(cpu_relocation),
            engine = as_string(engine),
            sync_batchnorm = as_flag(
              sync_batchnorm, null_ok = TRUE,
              meaning = paste(
                "TRUE takes BatchNormalization statistics over the whole",
                "batch (a step equals the template's); FALSE over each",
                "replica's share (TensorFlow only); NULL, the default, is the",
                "backend's choice: FALSE on TensorFlow, TRUE on JAX")),
            .optional = "engine")
}
