# R data for Keras: what R alone sees in it. A factor is class labels (sent
# as 0-based codes when it holds targets; as inputs, its codes would be one
# meaningless feature). A data frame is a list of columns: as.matrix() turns
# factor or character columns into strings, and keras3 sends it as one input
# per column. Strings are no numbers to train on. The core's functions take
# data converted here; keras3's fit(), evaluate() and predict() convert it
# themselves, after check_keras3_data().

#' R data for the core: double arrays as the model's float dtype, vectors as
#' 1-d arrays, factors of targets as 0-based integer codes, data frames as
#' matrices, lists element-wise; Python objects unchanged.
#'
#' Refused with the R fix: data frames whose `as.matrix()` would be strings
#' Keras cannot train on (factor columns, or character columns beside
#' numbers), factors as inputs, and strings as targets or weights.
#'
#' @param arg The argument's name, for messages (`x`, `y`, `data`, ...).
#' @param targets Whether `x` holds targets (`y`): factors are class labels.
#' @noRd
as_model_data <- function(x, dtype = "float32", arg = caller_arg(x),
                          targets = identical(arg, "y"), call = caller_env()) {
  force(arg)
  force(targets)
  force(call)
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  if (is.data.frame(x)) x <- data_frame_as_matrix(x, arg, targets, call)
  if (is.list(x)) {
    return(data_parts(x, arg, as_model_data, dtype = dtype, targets = targets, call = call))
  }
  check_data_values(x, arg, targets, call)
  if (is.factor(x)) return(array(as.integer(x) - 1L, dim = dim(x) %||% length(x)))
  # A plain vector would reach Python as a list; send a 1-d array.
  if ((is.numeric(x) || is.logical(x)) && is.null(dim(x))) x <- array(x, dim = length(x))
  if (is.double(x) && grepl("float", dtype)) {
    return(reticulate::np_array(x, dtype = dtype))
  }
  x
}

#' Refuses the data keras3's `fit()`, `evaluate()` and `predict()` would
#' send to Keras in a form it cannot train on, naming the R fix: every data
#' frame (keras3 would send one input per column), factors as inputs and
#' strings as targets or weights. keras3 converts the rest itself.
#' @returns `x`, invisibly.
#' @noRd
check_keras3_data <- function(x, arg = caller_arg(x), targets = identical(arg, "y"),
                              call = caller_env()) {
  force(arg)
  force(call)
  if (is.data.frame(x)) {
    fix <- if (targets) {
      sprintf("a vector or matrix: %s[[1]] for one column (a factor goes as 0-based class codes), as.matrix(%s) for numeric columns", arg, arg)
    } else {
      sprintf("a matrix: as.matrix(%s), or data.matrix(%s) to turn factor columns into numbers", arg, arg)
    }
    multigpu_abort(sprintf(
      "`%s` is %s, which keras3 would send to Keras as one %s per column. Pass %s.",
      arg, describe(x), if (targets) "target" else "input", fix
    ), class = "multigpu_type_error", call = call)
  }
  if (is.list(x) && !inherits(x, "python.builtin.object")) {
    data_parts(x, arg, check_keras3_data, targets = targets, call = call)
  } else {
    check_data_values(x, arg, targets, call)
  }
  invisible(x)
}

#' `validation_data`, `list(x_val, y_val)` or `list(x_val, y_val,
#' sample_weight_val)`, checked as check_keras3_data() checks `x` and `y`.
#' @noRd
check_validation_data <- function(data, arg = caller_arg(data), call = caller_env()) {
  if (!is.list(data) || is.data.frame(data) || inherits(data, "python.builtin.object")) {
    return(check_keras3_data(data, arg, targets = FALSE, call = call))
  }
  for (i in seq_along(data)) {
    check_keras3_data(data[[i]], element_name(data, i, arg), targets = i == 2L, call = call)
  }
  invisible(data)
}

#' Refuses a factor as inputs and strings as targets or sample weights,
#' naming the fix.
#' @noRd
check_data_values <- function(x, arg, targets, call) {
  if (is.factor(x) && !targets) {
    multigpu_abort(sprintf(
      "`%s` is a factor (%s): factors are class labels, for `y`. As an input, pass its 0-based class codes as a one-column matrix, matrix(as.integer(%s) - 1L), or one-hot columns from model.matrix().",
      arg, describe(x), arg
    ), class = "multigpu_type_error", call = call)
  }
  if (is.character(x) && (targets || arg == "sample_weight")) {
    fix <- if (targets) {
      sprintf("For class labels pass a factor, %s = factor(%s), sent as 0-based class codes; for numbers stored as text, as.numeric(%s).",
              arg, arg, arg)
    } else {
      sprintf("Pass numbers, e.g. as.numeric(%s).", arg)
    }
    multigpu_abort(sprintf("`%s` holds strings (%s): Keras trains on numbers. %s",
                           arg, describe(x), fix),
                   class = "multigpu_type_error", call = call)
  }
  invisible(x)
}

#' `fun` applied to each element of the list `x` given as `arg`, with the
#' element's name as R writes it (`x$a`, `x[[2]]`); names kept.
#' @noRd
data_parts <- function(x, arg, fun, ...) {
  parts <- lapply(seq_along(x), function(i) fun(x[[i]], arg = element_name(x, i, arg), ...))
  names(parts) <- names(x)
  parts
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

#' The float dtype a model's inputs are cast to.
#' @noRd
input_dtype <- function(object) {
  dtype <- tryCatch(object$input_dtype, error = function(e) NULL)
  if (is.character(dtype) && length(dtype) == 1L) dtype else "float32"
}
