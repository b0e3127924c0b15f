# The bridge to Python: every call into the core goes through `core()` (which
# checks the Python once), `call_core()` and `with_python()`, which turns
# Python exceptions into the classed R conditions of conditions.R and Python
# warnings into R warnings.

#' The multigpu Python module, after checking that it can work.
#'
#' The first call checks the Python (see ?multigpu_config) and imports the
#' module; a problem becomes a `multigpu_unavailable_error`.
#' @noRd
core <- function(call = caller_env()) {
  if (!isTRUE(.globals$ready)) {
    # The backend may have changed since the package loaded
    # (keras3::use_backend()); nothing is declared once Python runs.
    declare_python_requirements()
    problem <- python_problem()
    if (!is.null(problem)) {
      multigpu_abort(
        as.character(problem),
        class = c(if (inherits(problem, "multigpu_version_mismatch"))
                    "multigpu_version_error",
                  "multigpu_unavailable_error"),
        call = call
      )
    }
    # Imported now, so that what importing Keras creates (keras3's load
    # hook makes a tensor) exists before start_core_for_configuration()
    # frees it.
    tryCatch(reticulate::import("multigpu"), error = function(error) {
      multigpu_abort(sprintf("Importing the multigpu Python package failed: %s",
                             conditionMessage(error)),
                     class = "multigpu_unavailable_error", call = call)
    })
    .globals$ready <- TRUE
  }
  .globals$core
}

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
  multigpu_condition(message, class, call = call, python_type = last$type,
                     python_traceback = as.character(unlist(last$traceback)),
                     python_exception = exception)
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
      strategy <- reticulate::import("multigpu.distribute.strategy", convert = FALSE)
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
with_python <- function(expr, call = caller_env()) {
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
    list(message = message, call = error_call(call), python_type = category)
  ))
}

#' Call a function of the multigpu Python package.
#'
#' Arguments are already coerced by the caller; `NULL` arguments named in
#' `.optional` are left out so that Python uses its own default.
#' @noRd
call_core <- function(fn, ..., .optional = character(), call = caller_env()) {
  args <- check_no_na(list(...), fn, call = call)
  module <- core(call = call)
  with_python(do.call(module[[fn]], without_null(args, .optional)),
              call = call)
}

#' `args` without the `NULL` values of the arguments named in `optional`.
#' @noRd
without_null <- function(args, optional) {
  drop <- names(args) %in% optional & vapply(args, is.null, logical(1))
  args[!drop]
}

