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
  text <- paste(trimws(deparse(x, width.cutoff = 60L, nlines = 2L)),
                collapse = " ")
  if (nchar(text) > 70L) text <- paste0(substr(text, 1L, 67L), "...")
  text
}

# Message for a numeric argument that is not a count (negative numbers
# are one unless `negative_ok`).
count_problem <- function(x, negative_ok = FALSE) {
  if (anyNA(x)) return("contains NA or NaN")
  if (any(is.infinite(x))) return("is infinite")
  if (!negative_ok && any(x < 0)) return("is negative")
  if (any(x != trunc(x))) return("is not a whole number")
  if (any(abs(x) > .Machine$integer.max)) return("is too large for an integer")
  NULL
}

# "a whole number >= 1", or "a whole number" without a lower bound.
whole_number <- function(minimum) {
  if (is.finite(minimum)) sprintf("a whole number >= %d", as.integer(minimum))
  else "a whole number"
}

# The fix for a number given as a string or factor ("4", factor(4)).
unquoted_hint <- function(x, arg) {
  kind <- if (is.factor(x)) "factor" else "string"
  if (is.factor(x)) x <- as.character(x)
  number <- if (is.character(x) && length(x) == 1L && !is.na(x)) {
    suppressWarnings(as.numeric(x))
  } else {
    NA_real_
  }
  if (is.na(number)) return("")
  sprintf(" (a %s): write %s = %s, a number", kind, arg, format(number))
}

#' Coerce a whole number to an R integer (a Python int).
#'
#' R rejects what it alone can tell is no count (NA, NaN, Inf, fractions,
#' non-numbers and, unless `minimum` is `-Inf`, negative numbers); the core
#' judges the rest (e.g. 0 where it needs at least 1) with its own message.
#'
#' @param x A numeric vector.
#' @param arg The argument name, for messages.
#' @param null_ok Whether `NULL` is accepted (and returned as is).
#' @param minimum The smallest value the core accepts, for the advice in
#'   messages; `-Inf` for any whole number (negative ones too).
#' @returns An integer vector (a Python int when of length 1).
#' @noRd
as_count <- function(x, arg = deparse(substitute(x)), null_ok = TRUE,
                     call = caller_call(), minimum = 1) {
  force(arg)
  expected <- whole_number(minimum)
  if (is.null(x)) {
    if (null_ok) return(NULL)
    multigpu_abort(sprintf("`%s` must be %s, not NULL.", arg, expected),
                   call = call)
  }
  given <- x
  if (!is.numeric(x) && identical(length(x), 1L) && is.na(x)) x <- NA_real_
  if (!is.numeric(x) || length(x) != 1L) {
    multigpu_abort(sprintf(
      "`%s` must be a single %s, not %s%s.", arg,
      sub("^a ", "", expected), describe(given), unquoted_hint(given, arg)
    ), call = call)
  }
  problem <- count_problem(x, negative_ok = !is.finite(minimum))
  if (!is.null(problem)) {
    multigpu_abort(sprintf(
      "`%s` %s: received %s. Use %s, such as %s = %d.",
      arg, problem, describe(given), expected, arg,
      max(2L, if (is.finite(minimum)) as.integer(minimum) else 2L)
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
  if (is.factor(x)) {
    count_in_factor(x, arg, call)
    x <- as.character(x)
  }
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
  if (is.character(x)) {
    x <- check_entries(unname(x))
    # One string that spells a number goes as written ("2", not list("2")),
    # so the core's message echoes what the user wrote.
    if (length(x) == 1L && spells_count(x)) return(x)
    return(as.list(x))
  }
  x
}

# Whether a string spells a whole number, such as "2".
spells_count <- function(text) grepl("^\\s*[0-9]+\\s*$", text)

# A device count given as a factor (gpus = factor(2)) is refused here: the
# core would receive its level, a string, and echo that instead.
count_in_factor <- function(x, arg, call) {
  if (length(x) != 1L || is.na(x)) return(invisible())
  level <- as.character(x)
  if (!spells_count(level)) return(invisible())
  number <- as.integer(level)
  multigpu_abort(sprintf(
    "Invalid `%s`: received factor(%s), a factor, neither a device count nor a device name. For %d devices pass the number: %s = %d.",
    arg, describe(level), number, arg, number
  ), call = call)
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

#' A single TRUE or FALSE, checked in R: anything else is refused with a
#' classed condition naming the argument, the value and (`meaning`) what
#' each choice does.
#' @noRd
as_true_or_false <- function(x, arg = deparse(substitute(x)), meaning = NULL,
                             call = caller_call()) {
  if (is.logical(x) && length(x) == 1L && !is.na(x)) return(x)
  multigpu_abort(sprintf(
    "`%s` must be TRUE or FALSE, not %s.%s", arg, describe(x),
    if (is.null(meaning)) "" else paste0(" ", meaning, ".")
  ), call = call)
}

#' A single string (e.g. a choice), NULL allowed; a factor is its label.
#' @noRd
as_string <- function(x, arg = deparse(substitute(x)), null_ok = TRUE,
                      call = caller_call()) {
  if (is.null(x) && null_ok) return(NULL)
  if (is.factor(x)) x <- as.character(x)
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
  if (is.numeric(x)) {
    return(as_count(x, arg, null_ok = FALSE, call = call, minimum = 0))
  }
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
#' 1-d arrays, factors of targets as 0-based integer codes, lists
#' element-wise; Python objects unchanged.
#'
#' Refused with the R fix: data frames whose `as.matrix()` would be strings
#' Keras cannot train on (factor columns, or character columns beside
#' numbers), factors as inputs, and strings as targets or weights.
#'
#' @param arg The argument's name, for messages (`x`, `y`, `data`, ...).
#' @param targets Whether `x` holds targets (`y`): factors are class labels.
#' @noRd
as_model_data <- function(x, dtype = "float32", arg = deparse(substitute(x)),
                          targets = identical(arg, "y"),
                          call = caller_call()) {
  force(arg)
  force(targets)
  force(call)
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  if (is.data.frame(x)) x <- data_frame_as_matrix(x, arg, targets, call)
  if (is.list(x)) {
    parts <- lapply(seq_along(x), function(i) {
      as_model_data(x[[i]], dtype, element_name(x, i, arg), targets, call)
    })
    names(parts) <- names(x)
    return(parts)
  }
  if (is.factor(x)) {
    if (!targets) {
      multigpu_abort(sprintf(
        "`%s` is a factor (%s): factors are class labels, for `y`. As an input, pass its 0-based class codes as a one-column matrix, matrix(as.integer(%s) - 1L), or one-hot columns from model.matrix().",
        arg, describe(x), arg
      ), class = "multigpu_type_error", call = call)
    }
    return(array(as.integer(x) - 1L, dim = dim(x) %||% length(x)))
  }
  if (is.character(x) && (targets || arg == "sample_weight")) {
    fix <- if (targets) {
      sprintf("For class labels pass a factor, %s = factor(%s), sent as 0-based class codes; for numbers stored as text, as.numeric(%s).",
              arg, arg, arg)
    } else {
      sprintf("Pass numbers, e.g. as.numeric(%s).", arg)
    }
    multigpu_abort(sprintf(
      "`%s` holds strings (%s): Keras trains on numbers. %s",
      arg, describe(x), fix
    ), class = "multigpu_type_error", call = call)
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

#' How element `i` of the list `x` given as `arg` is written in R.
#' @noRd
element_name <- function(x, i, arg) {
  name <- names(x)[i]
  if (is.null(name) || is.na(name) || !nzchar(name)) {
    return(sprintf("%s[[%d]]", arg, i))
  }
  if (make.names(name) == name) sprintf("%s$%s", arg, name)
  else sprintf("%s[[\"%s\"]]", arg, name)
}

#' A data frame as the matrix Keras takes; refused when `as.matrix()`
#' would turn numbers or factor levels into strings. A targets data frame
#' of one factor column is that factor (class labels).
#' @noRd
data_frame_as_matrix <- function(x, arg, targets, call) {
  kinds <- vapply(x, function(column) {
    if (is.factor(column)) "factor"
    else if (is.numeric(column) || is.logical(column)) "number"
    else if (is.character(column)) "string"
    else "other"
  }, character(1))
  if (targets && identical(unname(kinds), "factor")) return(x[[1L]])
  columns <- function(kind) {
    paste(sprintf("\"%s\"", names(x)[kinds == kind]), collapse = ", ")
  }
  first <- function(kind) names(x)[kinds == kind][[1L]]
  if (any(kinds == "factor")) {
    multigpu_abort(sprintf(
      "`%s` is a data frame with factor column(s) %s, which as.matrix() turns into strings Keras cannot train on. Use their 0-based class codes, e.g. %s$%s <- as.integer(%s$%s) - 1L, or one-hot columns from model.matrix().",
      arg, columns("factor"), arg, first("factor"), arg, first("factor")
    ), class = "multigpu_type_error", call = call)
  }
  if (any(kinds == "other")) {
    multigpu_abort(sprintf(
      "`%s` is a data frame with column(s) %s that are neither numbers nor strings (%s). Convert them to numbers first.",
      arg, columns("other"),
      paste(unique(vapply(x[kinds == "other"], function(column) class(column)[[1L]], "")),
            collapse = ", ")
    ), class = "multigpu_type_error", call = call)
  }
  if (any(kinds == "string") && (targets || any(kinds == "number"))) {
    multigpu_abort(sprintf(
      "`%s` is a data frame with character column(s) %s%s, which as.matrix() turns into strings Keras cannot train on. Convert them to numbers first, e.g. %s$%s <- as.integer(factor(%s$%s)) - 1L (class codes), or drop them.",
      arg, columns("string"), if (any(kinds == "number")) " beside numbers" else "",
      arg, first("string"), arg, first("string")
    ), class = "multigpu_type_error", call = call)
  }
  as.matrix(x)
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

#' Keras callbacks as a list: one callback object is wrapped; R values that
#' are no callback (a number, a string, an R function) are refused.
#' @noRd
as_callbacks <- function(callbacks, arg = "callbacks", call = caller_call()) {
  if (is.null(callbacks)) return(NULL)
  if (inherits(callbacks, "python.builtin.object")) {
    if (reticulate::py_has_attr(callbacks, "set_model")) return(list(callbacks))
    return(callbacks)  # a Python list of callbacks
  }
  entries <- if (is.list(callbacks)) callbacks else list(callbacks)
  bad <- !vapply(entries, inherits, logical(1), what = "python.builtin.object")
  if (any(bad)) {
    multigpu_abort(sprintf(
      "`%s` must be a Keras callback or a list of them, such as checkpoint_callbacks(dir) or keras$callbacks$EarlyStopping(); %s is not one.",
      arg, if (is.list(callbacks)) {
        sprintf("entry %d, %s,", which(bad)[[1L]], describe(entries[[which(bad)[[1L]]]]))
      } else {
        describe(callbacks)
      }
    ), class = "multigpu_type_error", call = call)
  }
  callbacks
}

#' `validation_data`: an R list of arrays, `list(x_val, y_val)` (and
#' sample weights), becomes the tuple Keras expects.
#' @noRd
as_validation_data <- function(data, dtype, arg = "validation_data",
                               call = caller_call()) {
  force(call)
  if (is.list(data) && !inherits(data, "python.builtin.object") &&
      !is.data.frame(data)) {
    parts <- lapply(seq_along(data), function(i) {
      as_model_data(data[[i]], dtype, element_name(data, i, arg),
                    targets = i == 2L, call = call)
    })
    return(do.call(reticulate::tuple, parts))
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
  weights <- unlist(class_weight)
  if (!is.numeric(weights) || length(weights) != length(ids) || anyNA(weights) ||
      any(!is.finite(weights)) || any(weights < 0)) {
    multigpu_abort(sprintf(
      "`%s` must give every class a finite weight >= 0 (an NA weight would make the loss NaN); received %s.",
      arg, describe(class_weight)
    ), call = call)
  }
  reticulate::py_dict(as.list(as.integer(ids)),
                      as.list(as.numeric(unlist(class_weight))))
}

#' `custom_objects`: NULL, a Python dict, or a list named by the names
#' the saved model uses (Python's 'float' object is not a mapping, else).
#' @noRd
as_custom_objects <- function(x, arg = "custom_objects", call = caller_call()) {
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  named <- !is.null(names(x)) && all(nzchar(names(x))) && !anyNA(names(x))
  if (!is.list(x) || !named) {
    multigpu_abort(sprintf(
      "`%s` must be NULL or a list named by the names the saved model uses, e.g. list(MyLayer = MyLayer); received %s.",
      arg, describe(x)
    ), class = "multigpu_type_error", call = call)
  }
  x
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

#' Refuses an argument that is a single `NA` on its way to Python, where
#' reticulate would turn it into a value: `TRUE` (a logical NA), the string
#' `"NA"` or NaN. The wrappers check the arguments they coerce; this catches
#' the ones passed on as they are (`device_type`, `shard_policy`, ...).
#' @param args The named arguments of a call to the core's `fn`.
#' @noRd
check_no_na <- function(args, fn, call = caller_call()) {
  for (name in names(args)) {
    value <- args[[name]]
    if (nzchar(name) && is.atomic(value) && length(value) == 1L &&
        !is.null(value) && is.na(value)) {
      multigpu_abort(sprintf(
        "`%s` must not be NA: received %s, which Python would read as %s. See ?%s for the values it takes.",
        name, describe(value),
        if (is.logical(value)) "TRUE" else if (is.character(value)) "the string \"NA\"" else "NaN",
        switch(fn, save_model = , load_model = "save_model_hdf5", fn)
      ), call = call)
    }
  }
  invisible(args)
}
