#' Will it fit: the memory each device needs to train a model
#'
#' Counts the bytes data parallelism puts on each device for one training
#' step, each device taking `ceil(batch_size / devices)` rows of the batch:
#' all weights, one gradient per trainable weight and the optimizer's
#' variables (Adam's two moments, its iteration count and learning rate),
#' counted exactly (a float32 weight is 4 bytes; the optimizer's variables
#' are counted on a fresh copy built for the model, so `optimizer` is not
#' touched), and the activations of the device's rows, estimated from the
#' traced forward pass (every tensor it produces, the batch included). The
#' total is compared with each device's memory where TensorFlow reports it
#' (GPUs); CPUs report none, and `device_memory` stands in for it.
#'
#' On CPU the plan's total is within 0.5 to 2 times the peak that
#' TensorFlow's allocator measures for a training step on the same rows
#' (checked by the package's tests on a dense and a convolutional model).
#'
#' @param model A Keras model with an input shape, or a model returned by
#'   [multi_gpu_model()] (its template is planned).
#' @param batch_size The global batch, a whole number >= 1.
#' @param gpus The devices, as for [multi_gpu_model()]: `NULL` (every GPU,
#'   or every logical CPU device), a count >= 2, GPU ids or device names.
#' @param optimizer An optimizer such as `optimizer_adam()`, or its name;
#'   `NULL` for the optimizer `model` was compiled with.
#' @param device_memory `NULL` to use the memory TensorFlow reports, or the
#'   bytes of one device's memory, such as `16 * 2^30` for 16 GiB.
#' @returns An object of class `multigpu_memory_plan`, a list with the bytes
#'   on each device `weights`, `gradients`, `optimizer`, `activations` and
#'   `total`; `batch_size`, `per_replica_batch`, `devices`, `device_memory`
#'   (a named numeric vector, `NA` where not reported), `fits` (`TRUE`,
#'   `FALSE`, or `NA` when no device reports its memory) and `notes`. For a
#'   model from [model_parallel()] on JAX, whose devices hold different
#'   shards, the entries are the fullest device's and `per_device` is a data
#'   frame with one row per device (`device` and the same entries).
#'   Printing it shows a table.
#' @family will it fit
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 784) |>
#'   layer_dense(256, activation = "relu") |>
#'   layer_dense(10)
#' plan <- memory_plan(model, batch_size = 512, gpus = 2, optimizer = optimizer_adam())
#' plan
#' plan$optimizer == 2 * plan$gradients + 12   # m and v, iterations, learning rate
#' memory_plan(model, 512, gpus = 2, optimizer = "sgd", device_memory = 2^30)$fits
memory_plan <- function(model, batch_size, gpus = NULL, optimizer = NULL,
                        device_memory = NULL) {
  check_model(model)
  plan <- call_core("memory_plan", model,
                    batch_size = as_count(batch_size, null_ok = FALSE),
                    gpus = as_device_list(gpus), optimizer = optimizer,
                    device_memory = device_memory)
  as_memory_plan(plan)
}

#' The Python MemoryPlan as an R list of class multigpu_memory_plan.
#' @noRd
as_memory_plan <- function(plan) {
  entries <- plan$as_dict()
  memory <- entries$device_memory
  result <- structure(
    list(weights = as.double(entries$weights),
         gradients = as.double(entries$gradients),
         optimizer = as.double(entries$optimizer),
         activations = as.double(entries$activations),
         total = as.double(entries$total),
         batch_size = as.integer(entries$batch_size),
         per_replica_batch = as.integer(entries$per_replica_batch),
         devices = unlist(entries$devices),
         device_memory = vapply(memory, function(m) if (is.null(m)) NA_real_ else as.double(m), 0),
         fits = entries$fits %||% NA,
         notes = unlist(entries$notes),
         text = plan$table()),
    class = "multigpu_memory_plan"
  )
  # Only a model whose devices hold different shards has one.
  if (!is.null(entries$per_device)) {
    result$per_device <- per_device_frame(entries$per_device)
  }
  result
}

#' The per-device entries of a model whose weights are split across its
#' devices, as a data frame (one row per device).
#' @noRd
per_device_frame <- function(per_device) {
  rows <- lapply(names(per_device), function(device) {
    entries <- per_device[[device]]
    data.frame(device = device,
               weights = as.double(entries$weights),
               gradients = as.double(entries$gradients),
               optimizer = as.double(entries$optimizer),
               activations = as.double(entries$activations),
               total = as.double(entries$total))
  })
  do.call(rbind, rows)
}

#' Print a memory plan
#'
#' Prints the bytes of each entry of a [memory_plan()] on each device, then
#' each device's memory and whether the plan fits it.
#'
#' @param x What [memory_plan()] returned.
#' @param ... Unused.
#' @returns `x`, invisibly.
#' @family will it fit
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(16) |>
#'   layer_dense(1)
#' print(memory_plan(model, batch_size = 64, gpus = 2, optimizer = "adam"))
print.multigpu_memory_plan <- function(x, ...) {
  cat(x$text, "\n", sep = "")
  invisible(x)
}

#' The largest batch that fits
#'
#' The largest global batch whose [memory_plan()] fits every device's
#' memory. Weights, gradients and optimizer variables do not depend on the
#' batch; the activations grow with the rows, linearly. On GPUs (or with
#' `trial = TRUE`) a forward and backward pass of that many rows then runs
#' on the first device, and the batch backs off by 10% after each
#' out-of-memory error until one runs.
#'
#' @inheritParams memory_plan
#' @param device_memory `NULL` to use the memory TensorFlow reports (GPUs
#'   only: on CPUs give it), or the bytes of one device's memory, such as
#'   `16 * 2^30` for 16 GiB.
#' @param trial `NULL` to run the trial passes only on GPUs, `TRUE` or
#'   `FALSE`.
#' @returns The global batch, an integer, a multiple of the number of
#'   devices.
#' @family will it fit
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 784) |>
#'   layer_dense(256, activation = "relu") |>
#'   layer_dense(10)
#' find_batch_size(model, gpus = 2, device_memory = 64 * 2^20, optimizer = "adam")
find_batch_size <- function(model, gpus = NULL, device_memory = NULL,
                            optimizer = NULL, trial = NULL) {
  check_model(model)
  batch <- call_core("find_batch_size", model, gpus = as_device_list(gpus),
                     device_memory = device_memory, optimizer = optimizer,
                     trial = if (is.null(trial)) NULL else as_flag(trial))
  as.integer(batch)
}
