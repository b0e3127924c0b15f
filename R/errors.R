#' Conditions signalled by multigpu
#'
#' Every error multigpu signals is a classed condition, so it can be caught
#' by kind with [tryCatch()] or [withCallingHandlers()]:
#'
#' | class | raised when |
#' | --- | --- |
#' | `multigpu_value_error` | an argument has an invalid value: rejected in R (`NA`, `NaN`, negative or non-whole numbers) or by the Python core (a Python `ValueError`) |
#' | `multigpu_type_error` | the Python core received an object of the wrong type (`TypeError`), e.g. `multi_gpu_model()` of something that is not a Keras model |
#' | `multigpu_runtime_error` | a Python `RuntimeError`, e.g. `virtual_devices()` called after TensorFlow started |
#' | `multigpu_os_error` | a Python `OSError` (a missing file, a permission problem) |
#' | `multigpu_python_error` | any error raised in Python; also carried by the three above when they come from Python |
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
#'   multigpu_runtime_error multigpu_python_error multigpu_unavailable_error
#'   multigpu_version_error multigpu_install_error multigpu_warning
#' @family multigpu environment
#' @examplesIf multigpu::is_multigpu_available()
#' virtual_devices(2)
#' keras <- reticulate::import("keras")
#' model <- keras$Sequential(list(keras$Input(shape = list(4L)),
#'                                keras$layers$Dense(2L)))
#' tryCatch(
#'   multi_gpu_model(model, gpus = 64),
#'   multigpu_value_error = function(e) message("Not that many: ", conditionMessage(e))
#' )
NULL

#' Signal a classed multigpu error.
#' @noRd
multigpu_abort <- function(message, class = "multigpu_value_error",
                           call = caller_call(), ...) {
  stop(structure(
    class = c(class, "multigpu_error", "error", "condition"),
    list(message = message, call = call, ...)
  ))
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

#' Turn the Python exception behind an R error into a multigpu condition.
#'
#' Returns `NULL` when the error did not come from Python.
#' @noRd
python_condition <- function(error, call) {
  if (inherits(error, "multigpu_error")) return(error)
  last <- reticulate::py_last_error()
  if (is.null(last)) return(NULL)
  exception <- attr(last, "exception")
  explained <- explain_python_error(exception)
  if (!is.null(explained)) {
    exception <- explained
    last$type <- class(explained)[[1]]
    last$type <- sub("^.*\\.", "", last$type)
    last$value <- reticulate::py_str(explained)
  }
  py_classes <- if (is.null(exception)) {
    paste0("python.builtin.", last$type)
  } else {
    class(exception)
  }
  mapped <- python_error_classes[intersect(py_classes, names(python_error_classes))]
  class <- c(unname(mapped[1L][!is.na(mapped[1L])]), "multigpu_python_error")
  message <- sub("\n+$", "", last$value %||% conditionMessage(error))
  structure(
    class = c(class, "multigpu_error", "error", "condition"),
    list(message = message, call = call, python_type = last$type,
         python_traceback = as.character(unlist(last$traceback)),
         python_exception = exception)
  )
}

#' The core's explanation of a failure of strategy code, or NULL.
#'
#' Under a strategy's scope, the core turns TensorFlow's cryptic errors for
#' classic mistakes into a `StrategyUsageError` naming the fix, when the
#' scope exits with the error. reticulate's `with()` exits the scope without
#' the error, so R asks the core directly.
#' @noRd
explain_python_error <- function(exception) {
  if (is.null(exception) || !isTRUE(.globals$ready)) return(NULL)
  tryCatch(
    {
      strategy <- reticulate::import("multigpu.strategy", convert = FALSE)
      explained <- strategy$explain_error(exception)
      if (reticulate::py_is_null_xptr(explained) ||
          identical(reticulate::py_to_r(explained), NULL)) NULL else explained
    },
    error = function(e) NULL
  )
}

#' Evaluate `expr`, which calls Python, translating what comes back.
#'
#' Python exceptions become classed R errors (see ?multigpu-conditions),
#' Python warnings R warnings of class `multigpu_warning`. While knitr
#' renders a document, what Python prints (Keras progress lines) is captured
#' and printed from R, so it lands in the document.
#' @noRd
with_python <- function(expr, call = caller_call()) {
  warnings <- reticulate::import("warnings", convert = FALSE)
  catcher <- warnings$catch_warnings(record = TRUE)
  caught <- catcher$`__enter__`()
  # Leave the warnings context whatever happens, an interrupt included.
  entered <- TRUE
  leave <- function() {
    if (entered) catcher$`__exit__`(NULL, NULL, NULL)
    entered <<- FALSE
  }
  on.exit(leave(), add = TRUE)
  reticulate::py_clear_last_error()
  # The core renders the values and function names in its messages in the
  # caller's language: R here (NULL, TRUE, c(0, 1), virtual_devices(n)).
  if (isTRUE(.globals$ready)) {
    messages <- reticulate::import("multigpu.messages", convert = FALSE)
    token <- messages$set_language("r")
    on.exit(messages$reset_language(token), add = TRUE)
  }
  # Only the outermost call captures: reticulate's capture is not
  # reentrant (a nested one, e.g. from an R function Python calls back,
  # would leave Python's stdout closed).
  capture <- isTRUE(getOption("knitr.in.progress")) && !isTRUE(.globals$capturing)
  if (capture) {
    .globals$capturing <- TRUE
    on.exit(.globals$capturing <- FALSE, add = TRUE)
  }
  result <- tryCatch(
    {
      if (capture) {
        output <- reticulate::py_capture_output(value <- expr, type = "stdout")
        # reticulate ends what it captured with one newline too many.
        output <- sub("\n$", "", output)
        if (nzchar(output)) cat(output)
        value
      } else {
        expr
      }
    },
    error = function(error) {
      condition <- python_condition(error, call) %||% error
      leave()
      stop(condition)
    }
  )
  leave()
  n_caught <- reticulate::py_len(caught)
  for (i in seq_len(n_caught)) {
    signal_python_warning(reticulate::py_get_item(caught, i - 1L), call)
  }
  result
}

signal_python_warning <- function(warning, call) {
  message <- reticulate::py_str(warning$message)
  category <- reticulate::py_to_r(warning$category$`__name__`)
  warning(structure(
    class = c("multigpu_warning", "warning", "condition"),
    list(message = message, call = call, python_type = category)
  ))
}

#' Call a function of the multigpu Python package.
#'
#' Arguments are already coerced by the caller; `NULL` arguments named in
#' `.optional` are left out so that Python uses its own default.
#' @noRd
call_core <- function(fn, ..., .optional = character(), call = caller_call()) {
  args <- list(...)
  drop <- names(args) %in% .optional & vapply(args, is.null, logical(1))
  args <- args[!drop]
  module <- core(call = call)
  with_python(do.call(module[[fn]], args), call = call)
}
