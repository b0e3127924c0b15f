# Argument coercion shared by every wrapper.
#
# R has no scalars and no integers by default: `2` is a double vector of
# length 1, which reticulate turns into the Python float 2.0, and a vector of
# length 1 becomes a Python scalar, never a list. These helpers turn R values
# into what the Python core expects, and reject only what R alone can tell is
# wrong (NA, NaN, negative or non-whole numbers) with a message naming the
# argument. Everything else is passed on for the Python core to judge.

# `x` as a short string for messages: `c(0, NA)`, `"a"`, `<function>`.
describe <- function(x) {
  if (is.null(x)) return("NULL")
  if (is.function(x)) return("a function")
  if (inherits(x, "python.builtin.object")) {
    return(sprintf("a Python %s", class(x)[[1]]))
  }
  if (is.data.frame(x)) {
    return(sprintf("a data frame (%d x %d)", nrow(x), ncol(x)))
  }
  if (!is.atomic(x) && !is.list(x)) {
    return(sprintf("an object of class %s", class(x)[[1]]))
  }
  if (is.factor(x)) x <- as.character(x)
  text <- paste(deparse(x, width.cutoff = 60L, nlines = 2L), collapse = " ")
  if (nchar(text) > 70L) text <- paste0(substr(text, 1L, 67L), "...")
  text
}

# Message for a numeric argument that is not a count.
count_problem <- function(x) {
  if (anyNA(x)) return("contains NA or NaN")
  if (any(is.infinite(x))) return("is infinite")
  if (any(x < 0)) return("is negative")
  if (any(x != trunc(x))) return("is not a whole number")
  if (any(x > .Machine$integer.max)) return("is too large for an integer")
  NULL
}

#' Coerce a whole number to an R integer (a Python int).
#'
#' @param x A numeric vector.
#' @param arg The argument name, for messages.
#' @param null_ok Whether `NULL` is accepted (and returned as is).
#' @returns An integer vector (a Python int when of length 1).
#' @noRd
as_count <- function(x, arg = deparse(substitute(x)), null_ok = TRUE,
                     call = caller_call()) {
  force(arg)
  if (is.null(x)) {
    if (null_ok) return(NULL)
    multigpu_abort(sprintf("`%s` must be a whole number >= 0, not NULL.", arg),
                   call = call)
  }
  given <- x
  if (!is.numeric(x) && identical(length(x), 1L) && is.na(x)) x <- NA_real_
  if (!is.numeric(x) || length(x) != 1L) {
    multigpu_abort(sprintf(
      "`%s` must be a single whole number >= 0, not %s.", arg, describe(given)
    ), call = call)
  }
  problem <- count_problem(x)
  if (!is.null(problem)) {
    multigpu_abort(sprintf(
      "`%s` %s: received %s. Use a whole number >= 0, such as %s = 2.",
      arg, problem, describe(given), arg
    ), call = call)
  }
  as.integer(x)
}

#' Coerce a `gpus`/`devices` argument to what the Python resolver expects.
#'
#' `NULL` stays `NULL` (every device). One number is a device *count*; a
#' numeric vector of two or more is a vector of GPU *ids*, sent as a Python
#' list. A character vector is a set of device names, always sent as a list.
#' An R list is always a list of ids or names, even of length one. Other
#' values (Python objects, logicals, ...) are passed on unchanged for the
#' Python core to accept or reject.
#' @noRd
as_device_list <- function(x, arg = deparse(substitute(x)),
                           call = caller_call()) {
  force(arg)
  check_entries <- function(values) {
    if (is.numeric(values)) {
      problem <- count_problem(values)
      if (!is.null(problem)) {
        what <- if (length(values) == 1L) "a device count" else "GPU ids"
        multigpu_abort(sprintf(
          "`%s` %s: received %s. Use NULL for every device, one whole number for %s (e.g. %s = 2), or a vector of whole-number GPU ids (e.g. %s = c(0, 1)).",
          arg, problem, describe(x), "a device count", arg, arg
        ), call = call)
      }
      return(as.integer(values))
    }
    if (is.character(values) && anyNA(values)) {
      multigpu_abort(sprintf(
        "`%s` contains NA: received %s. Use device names such as c(\"/cpu:0\", \"/cpu:1\").",
        arg, describe(x)
      ), call = call)
    }
    values
  }
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  if (is.factor(x)) x <- as.character(x)
  if (is.atomic(x) && anyNA(x) && !is.numeric(x) && !is.character(x)) {
    multigpu_abort(sprintf(
      "`%s` must not be NA: received %s. Use NULL for every device, a number of devices (e.g. %s = 2), GPU ids (e.g. %s = c(0, 1)) or device names.",
      arg, describe(x), arg, arg
    ), call = call)
  }
  if (is.list(x)) {
    return(lapply(unname(x), function(value) {
      if (is.factor(value)) value <- as.character(value)
      if (is.numeric(value) || is.character(value)) {
        check_entries(value)
      } else {
        value
      }
    }))
  }
  if (is.numeric(x)) {
    x <- check_entries(unname(x))
    return(if (length(x) == 1L) x else as.list(x))
  }
  if (is.character(x)) return(as.list(check_entries(unname(x))))
  x
}

#' Check a TRUE/FALSE flag; NA is rejected, other types go to Python.
#' @noRd
as_flag <- function(x, arg = deparse(substitute(x)), call = caller_call()) {
  if (is.logical(x) && length(x) == 1L && is.na(x)) {
    multigpu_abort(sprintf("`%s` must be TRUE or FALSE, not NA.", arg),
                   call = call)
  }
  x
}

#' A single string (e.g. a choice), NULL allowed.
#' @noRd
as_string <- function(x, arg = deparse(substitute(x)), null_ok = TRUE,
                      call = caller_call()) {
  if (is.null(x) && null_ok) return(NULL)
  if (!is.character(x) || length(x) != 1L || is.na(x)) {
    multigpu_abort(sprintf("`%s` must be a single string, not %s.", arg,
                           describe(x)), call = call)
  }
  x
}

#' A file or directory path: a single string, with `~` expanded.
#' @noRd
as_path <- function(x, arg = deparse(substitute(x)), call = caller_call()) {
  if (!is.character(x) || length(x) != 1L || is.na(x) || !nzchar(x)) {
    multigpu_abort(sprintf("`%s` must be a single non-empty path, not %s.",
                           arg, describe(x)), call = call)
  }
  path.expand(x)
}

#' Keras `verbose`: "auto", 0, 1 or 2 (TRUE/FALSE accepted as 1/0).
#'
#' `"auto"` becomes 2 (one line per epoch) while knitr renders a document,
#' where a progress bar would print every update.
#' @noRd
as_verbose <- function(x, arg = deparse(substitute(x)), call = caller_call()) {
  force(arg)
  if (identical(x, "auto")) {
    return(if (isTRUE(getOption("knitr.in.progress"))) 2L else "auto")
  }
  if (is.logical(x) && length(x) == 1L && !is.na(x)) return(as.integer(x))
  if (is.numeric(x)) return(as_count(x, arg, null_ok = FALSE, call = call))
  multigpu_abort(sprintf(
    "`%s` must be \"auto\", 0 (silent), 1 (progress bar) or 2 (one line per epoch), not %s.",
    arg, describe(x)
  ), call = call)
}

#' A character vector as a Python list (length one included); lists and
#' Python objects unchanged. Used for `metrics`.
#' @noRd
as_py_list <- function(x) {
  if (is.character(x)) return(as.list(x))
  x
}

#' R data for Keras: double arrays as the model's float dtype, vectors as
#' 1-d arrays, factors as 0-based integer codes, lists element-wise; Python
#' objects unchanged.
#' @noRd
as_model_data <- function(x, dtype = "float32") {
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  if (is.data.frame(x)) x <- as.matrix(x)
  if (is.list(x)) return(lapply(x, as_model_data, dtype = dtype))
  if (is.factor(x)) {
    return(array(as.integer(x) - 1L, dim = dim(x) %||% length(x)))
  }
  # A plain vector would reach Python as a list; send a 1-d array.
  if ((is.numeric(x) || is.logical(x)) && is.null(dim(x))) {
    x <- array(x, dim = length(x))
  }
  if (is.double(x) && grepl("float", dtype)) {
    return(reticulate::np_array(x, dtype = dtype))
  }
  x
}

#' `object` must be a Python object (a Keras model) for R to call its methods.
#' @noRd
check_model <- function(object, arg = deparse(substitute(object)),
                        call = caller_call()) {
  if (!inherits(object, "python.builtin.object")) {
    multigpu_abort(sprintf(
      "`%s` must be a Keras model, not %s.", arg, describe(object)
    ), class = "multigpu_type_error", call = call)
  }
  invisible(object)
}

# ---- the arguments of the training methods ----

#' The float dtype a model's inputs are cast to.
#' @noRd
input_dtype <- function(object) {
  dtype <- tryCatch(object$input_dtype, error = function(e) NULL)
  if (is.character(dtype) && length(dtype) == 1L) dtype else "float32"
}

#' Whether `x` is a `tf.data` dataset.
#' @noRd
is_dataset <- function(x) {
  inherits(x, "tensorflow.python.data.ops.dataset_ops.DatasetV2")
}

#' Keras callbacks as a list: one callback object is wrapped.
#' @noRd
as_callbacks <- function(callbacks) {
  if (inherits(callbacks, "python.builtin.object")) return(list(callbacks))
  callbacks
}

#' `validation_data`: an R list of arrays becomes the tuple Keras expects.
#' @noRd
as_validation_data <- function(data, dtype) {
  if (is.list(data) && !inherits(data, "python.builtin.object")) {
    return(do.call(reticulate::tuple, unname(as_model_data(data, dtype))))
  }
  data
}

#' `class_weight`: named by 0-based class index, sent as a Python dict.
#' @noRd
as_class_weight <- function(class_weight, arg = "class_weight",
                            call = caller_call()) {
  if (is.null(class_weight) || inherits(class_weight, "python.builtin.object")) {
    return(class_weight)
  }
  ids <- suppressWarnings(as.numeric(names(class_weight)))
  if (is.null(names(class_weight)) || anyNA(ids)) {
    multigpu_abort(sprintf(
      "`%s` must be named by 0-based class index, e.g. c(\"0\" = 1, \"1\" = 5); received %s.",
      arg, describe(class_weight)
    ), call = call)
  }
  reticulate::py_dict(as.list(as.integer(ids)),
                      as.list(as.numeric(unlist(class_weight))))
}

#' A fraction in [0, 1), as a double.
#' @noRd
as_fraction <- function(x, arg = deparse(substitute(x)), call = caller_call()) {
  if (!is.numeric(x) || length(x) != 1L || is.na(x) || x < 0 || x >= 1) {
    multigpu_abort(sprintf(
      "`%s` must be a fraction in [0, 1), not %s.", arg, describe(x)
    ), call = call)
  }
  as.double(x)
}

#' A 1-based epoch (as in keras3) as Keras's 0-based index.
#' @noRd
as_epoch_index <- function(x, arg = "initial_epoch", call = caller_call()) {
  epoch <- as_count(x, arg, null_ok = FALSE, call = call)
  if (epoch < 1L) {
    multigpu_abort(sprintf(
      "`%s` counts from 1 (the first epoch), as in keras3: received %s.",
      arg, describe(x)
    ), call = call)
  }
  epoch - 1L
}

`%||%` <- function(x, y) if (is.null(x)) y else x

# The call of the function that called the function calling this: used as
# the default `call` of a helper, it is the exported function's call, so
# errors read `Error in multi_gpu_model(model, gpus = NA): ...`.
caller_call <- function() {
  frame <- sys.parent(2L)
  if (frame == 0L) return(NULL)
  sys.call(frame)
}
