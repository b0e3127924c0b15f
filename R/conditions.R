#' Conditions signalled by multigpu
#'
#' Every error multigpu signals is a classed condition, so it can be caught
#' by kind with [tryCatch()] or [withCallingHandlers()]:
#'
#' | class | raised when |
#' | --- | --- |
#' | `multigpu_value_error` | an argument has an invalid value: rejected in R (`NA`, `NaN`, negative or non-whole numbers such as `batch_size = 2.5`, a number in quotes, an `NA` that Python would read as `TRUE`) or by the Python core (a Python `ValueError`) |
#' | `multigpu_type_error` | an object of the wrong type: R data Keras cannot train on (a factor as inputs, strings as `y`, a data frame with factor or character columns, or any data frame given to `fit()`, `evaluate()` or `predict()`), callbacks that are none, or a Python `TypeError`, e.g. `multi_gpu_model()` of something that is not a Keras model |
#' | `multigpu_runtime_error` | a Python `RuntimeError`, e.g. `virtual_devices()` called after TensorFlow started |
#' | `multigpu_os_error` | a Python `OSError` (a missing file, a permission problem), or a file that `overwrite = FALSE` keeps |
#' | `multigpu_python_error` | any error raised in Python; also carried by the four above when they come from Python |
#' | `multigpu_unavailable_error` | Python, TensorFlow, Keras or the multigpu Python package is missing or incompatible (see [multigpu_config()]) |
#' | `multigpu_version_error` | the multigpu Python package is another version than the R package (also a `multigpu_unavailable_error`); [install_multigpu()] installs the matching one |
#' | `multigpu_install_error` | [install_multigpu()] could not create or update the environment |
#' | `multigpu_error` | every error above |
#'
#' The message is the Python exception's message (or R's own), naming the
#' argument, the value received and the fix. Conditions raised from Python
#' also carry `python_type` (the exception's class name), `python_traceback`
#' (a character vector) and `python_exception` (the exception object).
#'
#' Python warnings issued during a multigpu call (such as the core's notice
#' that it falls back to CPU devices when there is no GPU) become R warnings
#' of class `multigpu_warning`, so [suppressWarnings()] and
#' `tryCatch(multigpu_warning = )` work on them.
#'
#' @name multigpu-conditions
#' @aliases multigpu_error multigpu_value_error multigpu_type_error
#'   multigpu_runtime_error multigpu_os_error multigpu_python_error
#'   multigpu_unavailable_error multigpu_version_error multigpu_install_error
#'   multigpu_warning
#' @family multigpu environment
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(2)
#' tryCatch(
#'   multi_gpu_model(model, gpus = 64),
#'   multigpu_value_error = function(e) message("Not that many: ", conditionMessage(e))
#' )
NULL

#' Signal a classed multigpu error.
#'
#' `call` is the call the error names: a call, or the frame of the function
#' that was called, as [rlang::caller_env()] gives it (see [error_call()]).
#' @noRd
multigpu_abort <- function(message, class = "multigpu_value_error",
                           call = caller_env(), ...) {
  stop(multigpu_condition(message, class, call = call, ...))
}

#' A multigpu error condition: `class`, then `multigpu_error`; the fields in
#' `...` (e.g. `python_type`) are carried along. A base R condition
#' (rlang's `abort()` would add the class `rlang_error`), so that errors
#' raised in R and those relayed from the core have the same classes.
#' @noRd
multigpu_condition <- function(message, class, call = NULL, ...) {
  structure(
    class = c(class, "multigpu_error", "error", "condition"),
    list(message = message, call = error_call(call), ...)
  )
}

#' The call a condition names: `call` itself, or the call of the frame
#' `call`, an S3 method's as its generic's (`fit(model, x)`, as the user
#' wrote it, not `fit.multigpu.engines.template.TemplateBacked(...)`).
#' @noRd
error_call <- function(call) {
  if (!is.environment(call)) return(call)
  generic <- rlang::env_get(call, ".Generic", default = NULL)
  call <- rlang::frame_call(call)
  if (is.character(generic) && is.call(call)) call[[1L]] <- as.name(generic)
  call
}

# Python exception classes (as reticulate names them) and the R condition
# class each maps to; the first match in the exception's MRO wins.
python_error_classes <- c(
  "python.builtin.ValueError" = "multigpu_value_error",
  "python.builtin.TypeError" = "multigpu_type_error",
  "python.builtin.RuntimeError" = "multigpu_runtime_error",
  "python.builtin.OSError" = "multigpu_os_error",
  "python.builtin.ImportError" = "multigpu_unavailable_error"
)
