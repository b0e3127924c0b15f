#' Is it faster: a callback that measures multi-device training
#'
#' Pass it to [fit()][keras3::fit] of a model that trains on several devices
#' (one from [multi_gpu_model()], or one built under [mirrored_strategy()]).
#' During the fit it measures the samples per second and the time of each
#' step. On the first step it keeps the batch `fit()` drew and trains a copy
#' of the model on one device for `baseline_steps` steps on it (same weights
#' and loss, a fresh copy of the optimizer; your model is not touched); the
#' speed-up is the baseline's step time over the measured one, the
#' efficiency the speed-up per device. When one device would be faster it
#' warns, once per fit.
#'
#' The step time is split where it can be measured: `host_seconds`, the
#' time between steps (keras3's loop, the progress bar, other callbacks) is
#' measured; `communication_seconds` is 0 between logical CPU devices
#' (TensorFlow passes references), and on GPUs it is `NA` unless `link` is
#' given, then estimated from the bytes the engine moves per step over that
#' link; `input_wait_seconds` is always `NA`: Keras draws each batch inside
#' the compiled step, where no callback can time it apart. The monitor's
#' own cost per step is in the package's benchmarks (docs/benchmarks.md).
#'
#' Read the results with [summary()][summary.multigpu.insight.monitor.ScalingMonitor]
#' and draw them with [plot()][plot.multigpu.insight.monitor.ScalingMonitor].
#'
#' @param baseline_steps Timed steps of the one-device copy, a whole
#'   number >= 0 (0: no baseline, so no speed-up, efficiency or warning).
#' @param warmup_steps Steps at the start of a fit left out of the
#'   measurements (the first compiles the step), a whole number >= 1.
#' @param link `NULL`, or `"pcie4"`, `"nvlink3"` or `"nvlink4"` to estimate
#'   the communication time on GPUs.
#' @param warn `TRUE` to warn when one device would be faster.
#' @returns A Keras callback (a Python object) for `fit(callbacks = )`.
#' @family is it faster
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(16, activation = "relu") |>
#'   layer_dense(3, activation = "softmax")
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' parallel_model |> compile(loss = loss_sparse_categorical_crossentropy(),
#'                           optimizer = optimizer_adam())
#' monitor <- callback_scaling_monitor(warn = FALSE)
#' parallel_model |> fit(as.matrix(iris[, 1:4]), as.integer(iris$Species) - 1L,
#'                       epochs = 2, batch_size = 16, verbose = 0,
#'                       callbacks = list(monitor))
#' summary(monitor)[c("samples_per_second", "efficiency")]
#' plot(monitor)
callback_scaling_monitor <- function(baseline_steps = 5, warmup_steps = 2,
                                     link = NULL, warn = TRUE) {
  call_core("ScalingMonitor",
            baseline_steps = as_count(baseline_steps, null_ok = FALSE, minimum = 0),
            warmup_steps = as_count(warmup_steps, null_ok = FALSE),
            link = as_string(link), warn = as_flag(warn))
}

#' What a scaling monitor measured
#'
#' @param object A callback from [callback_scaling_monitor()] that watched a
#'   fit.
#' @param ... Unused.
#' @returns A list: `devices` (their number), `engine` (`"replicate"`,
#'   `"mirrored"`, `"strategy"` or `"single"`), `batch_size` (rows per
#'   step), `steps` (measured), `samples_per_second`, `step_seconds`,
#'   `compute_seconds`, `communication_seconds`, `input_wait_seconds`,
#'   `host_seconds`, `baseline_samples_per_second`, `baseline_step_seconds`,
#'   `speedup`, `efficiency` (each `NA` when not measured or not
#'   measurable) and `notes`, sentences saying what is missing and why.
#' @family is it faster
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' strategy <- mirrored_strategy()
#' with(strategy$scope(), {
#'   model <- keras_model_sequential(input_shape = 4) |> layer_dense(1)
#'   model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#' })
#' monitor <- callback_scaling_monitor(warn = FALSE)
#' x <- matrix(runif(512), ncol = 4)
#' model |> fit(x, rowSums(x), batch_size = 16, epochs = 1, verbose = 0,
#'              callbacks = list(monitor))
#' str(summary(monitor))
summary.multigpu.insight.monitor.ScalingMonitor <- function(object, ...) {
  result <- with_python(object$summary())
  notes <- unlist(result$notes)
  result <- lapply(result[setdiff(names(result), "notes")],
                   function(value) if (is.null(value)) NA else value)
  result$steps <- as.integer(result$steps)
  result$devices <- as.integer(result$devices)
  if (!is.na(result$batch_size)) result$batch_size <- as.integer(result$batch_size)
  result$notes <- notes
  result
}

#' Plot what a scaling monitor measured
#'
#' Draws, with base graphics, the samples per second of each measured step,
#' with dashed lines for the one-device baseline and the ideal (the baseline
#' times the devices); the title gives the speed-up and efficiency. The
#' numbers are the Python core's (`multigpu.insight.plotting.scaling_lines`).
#'
#' @param x A callback from [callback_scaling_monitor()] that watched a fit.
#' @param y Unused.
#' @param ... Further graphical parameters for [graphics::plot()].
#' @returns A data frame of the steps drawn (`step`, `samples_per_second`),
#'   invisibly, with attribute `levels`, the baseline and ideal samples per
#'   second (named).
#' @family is it faster
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |> layer_dense(1)
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' parallel_model |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_sgd())
#' monitor <- callback_scaling_monitor(warn = FALSE)
#' x <- matrix(runif(512), ncol = 4)
#' parallel_model |> fit(x, rowSums(x), batch_size = 16, epochs = 1, verbose = 0,
#'                       callbacks = list(monitor))
#' plot(monitor)
plot.multigpu.insight.monitor.ScalingMonitor <- function(x, y, ...) {
  summary <- with_python(x$summary())
  plotting <- reticulate::import("multigpu.insight.plotting")
  lines <- with_python(plotting$scaling_lines(summary, x$history()))
  steps <- as.integer(unlist(lines$steps))
  if (!length(steps)) {
    multigpu_abort(
      "`x` has measured no step after its warm-up; plot it after a fit of a few steps.",
      class = "multigpu_value_error")
  }
  samples <- as.double(unlist(lines$samples_per_second))
  levels <- vapply(lines$levels, function(level) as.double(level[[2]]), 0)
  names(levels) <- vapply(lines$levels, function(level) level[[1]], "")
  graphics::plot(steps, samples, type = "o", pch = 16, col = "#1f77b4",
                 ylim = c(0, max(c(samples, levels), na.rm = TRUE)),
                 xlab = "step", ylab = "samples per second", ...)
  graphics::abline(h = levels, lty = c(2, 3)[seq_along(levels)], col = "grey40")
  if (!is.null(summary$speedup)) {
    graphics::title(sprintf("speed-up %.2f, efficiency %.2f",
                            summary$speedup, summary$efficiency))
  }
  graphics::legend("bottomright", bty = "n", cex = 0.8,
                   legend = c(sprintf("%d devices (%s)", as.integer(summary$devices),
                                      summary$engine), names(levels)),
                   col = c("#1f77b4", rep("grey40", length(levels))),
                   lty = c(1, c(2, 3)[seq_along(levels)]),
                   pch = c(16, rep(NA, length(levels))))
  frame <- data.frame(step = steps, samples_per_second = samples)
  attr(frame, "levels") <- levels
  invisible(frame)
}
