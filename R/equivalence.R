#' Does training on several devices give one device's numbers?
#'
#' Trains a compiled model for `steps` steps on the same batches, in the
#' same order (the first `steps * batch_size` rows of `x`, not shuffled),
#' twice: on a single device, and through `engine`, and compares what they
#' logged and learned. `"auto"` (the default), `"replicate"` and
#' `"mirrored"` are the engines of [multi_gpu_model()] on TensorFlow, and
#' `"jax"` its engine after `keras3::use_backend("jax")` (`"auto"` runs the
#' one [multi_gpu_model()] runs by default on these devices);
#' `"strategy"` copies the model under [mirrored_strategy()]'s scope and
#' trains the copy with keras3's own `fit()`. The one-device run is `model`
#' itself, not a copy, so an engine's copy that lost some of the model's
#' state (an adapted normalization's mean, a lookup's vocabulary, an
#' attribute set on a layer after it was made) cannot agree with a copy
#' that lost the same: such a copy is reported as the difference `copy`.
#' Both runs start from the model's weights, with a new optimizer of the
#' model's optimizer's class and settings and the model's loss and metrics;
#' afterwards `model` is as it was (weights, optimizer and its state,
#' compiled loss and metrics).
#'
#' A quantity agrees when its largest absolute difference is at most
#' `tolerance * max(1, largest absolute value of the one-device copy)`.
#' Loss and metrics are compared after every step, weights and optimizer
#' state after the last. A layer whose output depends on the rows it sees
#' (`layer_batch_normalization()`, which normalizes each device's share with
#' that share's statistics) is reported as different, and so is, under a
#' strategy, a loss function that averages the rows itself (each device's
#' average is summed), each with its cause and fix.
#'
#' @param model A compiled Keras model, the one you would pass to
#'   [multi_gpu_model()] (not the model it returns).
#' @param x Inputs: a matrix or array, or a list of them, with at least
#'   `steps * batch_size` rows.
#' @param y Targets for `x` (a factor is sent as 0-based class codes).
#' @param gpus The devices, as for [multi_gpu_model()]: `NULL` (every GPU,
#'   or every logical CPU device), a count >= 2, GPU ids or device names.
#' @param engine `"auto"` (the default: the engine [multi_gpu_model()]
#'   runs by default on these devices; the report's `engine` says which),
#'   `"replicate"`, `"mirrored"`, `"strategy"` (TensorFlow) or `"jax"`
#'   (JAX).
#' @param steps Training steps to compare, a whole number >= 1.
#' @param batch_size Rows per step (the global batch); `NULL` takes the
#'   largest multiple of the device count that leaves `steps` batches in
#'   `x`. With `"strategy"`, a multiple of the number of devices.
#' @param tolerance The relative tolerance, a number >= 0.
#' @param sync_batchnorm `TRUE` builds the engine's model with
#'   `multi_gpu_model(sync_batchnorm = TRUE)` (batch normalization
#'   statistics over the whole batch); `FALSE` with
#'   `multi_gpu_model(sync_batchnorm = FALSE)` (each device's share);
#'   `NULL` (the default) as [multi_gpu_model()] does by default, the
#'   backend's choice (`FALSE` on TensorFlow). `TRUE` is not for
#'   `engine = "strategy"`.
#' @returns An object of class `multigpu_equivalence`, a list with `equal`
#'   (`TRUE` when every quantity agrees), `differences` (a named numeric
#'   vector, the largest absolute difference of `loss`, each metric,
#'   `weights`, `batchnorm_statistics` (moving means and variances, only for
#'   models with batch normalization) and `optimizer_state`; only `copy`
#'   when the engine's copy of the model computes otherwise before any
#'   training), `tolerance`, `first_difference` (the first quantity that
#'   differs, or `NULL`), `cause` (its likely cause and fix, or `NULL`),
#'   `engine` (the engine that ran), `requested_engine` (the `engine`
#'   argument), `engine_reason` (why that engine ran), `devices`, `steps`
#'   and `batch_size`. Printing it names the engine, the first quantity
#'   that differs and its likely cause.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(16, activation = "relu") |>
#'   layer_dense(3, activation = "softmax")
#' model |> compile(loss = loss_sparse_categorical_crossentropy(),
#'                  optimizer = optimizer_adam(),
#'                  metrics = list(metric_sparse_categorical_accuracy()))
#' x <- as.matrix(iris[, 1:4])
#' report <- check_equivalence(model, x, iris$Species, gpus = 2)
#' report$equal
#' report$engine   # the engine "auto" chose
#' report$differences
#' report   # prints the first quantity that differs, if any, and why
check_equivalence <- function(model, x, y, gpus = NULL,
                              engine = c("auto", "replicate", "mirrored",
                                         "strategy", "jax"),
                              steps = 3, batch_size = NULL, tolerance = 1e-4,
                              sync_batchnorm = NULL) {
  check_model(model)
  if (missing(engine)) engine <- engine[[1L]]
  dtype <- input_dtype(model)
  report <- call_core("check_equivalence", model,
                      x = as_model_data(x, dtype),
                      y = as_model_data(y, dtype, arg = "y", targets = TRUE),
                      gpus = as_device_list(gpus),
                      engine = as_string(engine, null_ok = FALSE),
                      steps = as_count(steps, null_ok = FALSE),
                      batch_size = as_count(batch_size),
                      tolerance = tolerance,
                      sync_batchnorm = as_flag(sync_batchnorm, null_ok = TRUE),
                      .optional = "sync_batchnorm")
  differences <- report$differences
  structure(
    list(equal = report$equal,
         differences = vapply(differences, as.double, 0),
         tolerance = report$tolerance,
         first_difference = report$first_difference,
         cause = report$cause,
         engine = report$engine,
         requested_engine = report$requested_engine,
         engine_reason = report$engine_reason,
         devices = unlist(report$devices),
         steps = as.integer(report$steps),
         batch_size = as.integer(report$batch_size),
         text = with_python(reticulate::py_str(report))),
    class = "multigpu_equivalence"
  )
}

#' Print what check_equivalence() found
#'
#' Prints the number of steps and rows compared, the engine (with
#' `engine = "auto"`, the one it chose and why), whether the two runs
#' agree, the largest difference of every quantity, and, when one differs,
#' the first that does and its likely cause, in R terms.
#'
#' @param x What [check_equivalence()] returned.
#' @param ... Unused.
#' @returns `x`, invisibly.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(8) |>
#'   layer_batch_normalization() |>
#'   layer_dense(1)
#' model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#' x <- matrix(runif(96), ncol = 4)
#' print(check_equivalence(model, x, rowSums(x), gpus = 2, steps = 2))
print.multigpu_equivalence <- function(x, ...) {
  cat(x$text, "\n", sep = "")
  invisible(x)
}
