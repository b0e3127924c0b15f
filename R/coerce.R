# Argument coercion shared by the wrappers: what R alone sees.
#
# reticulate sends a logical NA as Python's True, NA_character_ as the
# string "NA", a double such as 2.5 as a float and a vector of length one as
# a scalar. These helpers refuse what R alone can tell is wrong (NA, NaN,
# Inf, non-whole or negative numbers, numbers in quotes) with a classed
# condition naming the argument (rlang::caller_arg()) and the call of the
# exported function (rlang::caller_env()), and turn the rest into what the
# core expects. The core judges everything else and answers in R's words
# (multigpu.messages), as the bridge relays it.

# `x` as a short string for messages: `c(0, NA)`, `"a"`, `a function`.
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

# What makes the numbers `x` no count, or NULL (negative numbers are one
# unless `negative_ok`).
count_problem <- function(x, negative_ok = FALSE) {
  if (anyNA(x)) return("contains NA or NaN")
  if (any(is.infinite(x))) return("is infinite")
  if (!negative_ok && any(x < 0)) return("is negative")
  if (any(x != trunc(x))) return("is not a whole number")
  if (any(abs(x) > .Machine$integer.max)) return("is too large for an integer")
  NULL
}

# The fix for a number written as a string or a factor ("4", factor(4)).
unquoted_hint <- function(x, arg) {
  if (!is.character(x) && !is.factor(x) || length(x) != 1L) return("")
  kind <- if (is.factor(x)) "factor" else "string"
  number <- suppressWarnings(as.numeric(as.character(x)))
  if (is.na(number)) return("")
  sprintf(" (a %s): write %s = %s, a number", kind, arg, format(number))
}

#' A whole number as an R integer (a Python int).
#'
#' Refuses what R alone can tell is no count: NA, NaN, Inf, fractions,
#' numbers too large for an integer, non-numbers and, unless `minimum` is
#' `-Inf`, negative numbers. The core judges the rest (e.g. 0 where it needs
#' at least 1).
#'
#' @param x A number.
#' @param arg The argument's name, for messages.
#' @param null_ok Whether `NULL` is accepted (and returned as is).
#' @param minimum The smallest value the core accepts, for the advice in
#'   messages; `-Inf` for any whole number (a seed).
#' @returns An integer (a Python int), or `NULL`.
#' @noRd
as_count <- function(x, arg = caller_arg(x), null_ok = TRUE,
                     call = caller_env(), minimum = 1) {
  force(arg)
  expected <- if (is.finite(minimum)) sprintf("a whole number >= %d", as.integer(minimum))
  else "a whole number"
  if (is.null(x) && null_ok) return(NULL)
  if (is.null(x)) multigpu_abort(sprintf("`%s` must be %s, not NULL.", arg, expected), call = call)
  given <- x
  if (!is.numeric(x) && identical(length(x), 1L) && is.na(x)) x <- NA_real_
  if (!is.numeric(x) || length(x) != 1L) {
    multigpu_abort(sprintf("`%s` must be a single %s, not %s%s.", arg,
                           sub("^a ", "", expected), describe(given),
                           unquoted_hint(given, arg)), call = call)
  }
  problem <- count_problem(x, negative_ok = !is.finite(minimum))
  if (!is.null(problem)) {
    multigpu_abort(sprintf(
      "`%s` %s: received %s. Use %s, such as %s = %d.", arg, problem,
      describe(given), expected, arg, max(2L, if (is.finite(minimum)) minimum else 2L)
    ), call = call)
  }
  as.integer(x)
}

#' A `gpus`/`devices` argument as the core's resolver takes it.
#'
#' `NULL` stays `NULL` (every device). One number is a device *count*; two
#' or more are GPU *ids*, sent as a Python list. Device names are always
#' sent as a list, as is an R list of ids or names. Other values (Python
#' objects, logicals, ...) go to the core as they are.
#' @noRd
as_device_list <- function(x, arg = caller_arg(x), call = caller_env()) {
  force(arg)
  given <- x
  check_entries <- function(values) {
    if (is.numeric(values)) {
      problem <- count_problem(values)
      if (!is.null(problem)) {
        multigpu_abort(sprintf(
          "`%s` %s: received %s. Use NULL for every device, one whole number for a device count (e.g. %s = 2), or a vector of whole-number GPU ids (e.g. %s = c(0, 1)).",
          arg, problem, describe(given), arg, arg
        ), call = call)
      }
      return(as.integer(values))
    }
    if (is.character(values) && anyNA(values)) {
      multigpu_abort(sprintf(
        "`%s` contains NA: received %s. Use device names such as c(\"/cpu:0\", \"/cpu:1\").",
        arg, describe(given)
      ), call = call)
    }
    values
  }
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  if (is.factor(x)) {
    check_count_in_factor(x, arg, call)
    x <- as.character(x)
  }
  if (is.atomic(x) && anyNA(x) && !is.numeric(x) && !is.character(x)) {
    multigpu_abort(sprintf(
      "`%s` must not be NA: received %s. Use NULL for every device, a number of devices (e.g. %s = 2), GPU ids (e.g. %s = c(0, 1)) or device names.",
      arg, describe(given), arg, arg
    ), call = call)
  }
  if (is.list(x)) {
    return(lapply(unname(x), function(value) {
      if (is.factor(value)) value <- as.character(value)
      if (is.numeric(value) || is.character(value)) check_entries(value) else value
    }))
  }
  if (!is.numeric(x) && !is.character(x)) return(x)
  x <- check_entries(unname(x))
  # One string that spells a number goes as written ("2", not list("2")),
  # so that the core's message echoes what the user wrote.
  if (length(x) == 1L && (is.numeric(x) || spells_count(x))) x else as.list(x)
}

# Whether a string spells a whole number, such as "2".
spells_count <- function(text) grepl("^\\s*[0-9]+\\s*$", text)

# A device count given as a factor (gpus = factor(2)) is refused here: the
# core would receive its level, a string, and echo that instead.
check_count_in_factor <- function(x, arg, call) {
  if (length(x) != 1L || is.na(x) || !spells_count(as.character(x))) {
    return(invisible())
  }
  number <- as.integer(as.character(x))
  multigpu_abort(sprintf(
    "Invalid `%s`: received factor(%s), a factor, neither a device count nor a device name. For %d devices pass the number: %s = %d.",
    arg, describe(as.character(x)), number, arg, number
  ), call = call)
}

#' A TRUE/FALSE flag.
#'
#' `NA`, which reticulate would send as `TRUE`, is refused. Other values go
#' to the core, which names what it takes, unless `meaning` (what each
#' choice does) is given: then R refuses all but `TRUE` and `FALSE` and the
#' message says what they do. With `null_ok`, `NULL` (the core's default)
#' is returned as is.
#' @noRd
as_flag <- function(x, arg = caller_arg(x), meaning = NULL, null_ok = FALSE,
                    call = caller_env()) {
  if (is.null(x) && null_ok) return(NULL)
  single <- is.logical(x) && length(x) == 1L
  if (single && !is.na(x) || !single && is.null(meaning)) return(x)
  multigpu_abort(sprintf(
    "`%s` must be %sTRUE or FALSE, not %s.%s", arg,
    if (null_ok) "NULL, " else "", describe(x),
    if (is.null(meaning)) "" else paste0(" ", meaning, ".")
  ), call = call)
}

#' A single string (e.g. a choice), `NULL` allowed; a factor is its label.
#' @noRd
as_string <- function(x, arg = caller_arg(x), null_ok = TRUE, call = caller_env()) {
  force(arg)
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
as_path <- function(x, arg = caller_arg(x), call = caller_env()) {
  if (!is.character(x) || length(x) != 1L || is.na(x) || !nzchar(x)) {
    multigpu_abort(sprintf("`%s` must be a single non-empty path, not %s.",
                           arg, describe(x)), call = call)
  }
  path.expand(x)
}

#' Keras `verbose`: "auto", 0, 1 or 2 (`TRUE`/`FALSE` read as 1/0).
#'
#' `"auto"` becomes 2 (one line per epoch) while knitr renders a document,
#' where a progress bar would print every update.
#' @noRd
as_verbose <- function(x, arg = caller_arg(x), call = caller_env()) {
  if (identical(x, "auto")) {
    return(if (isTRUE(getOption("knitr.in.progress"))) 2L else "auto")
  }
  if (is.logical(x) && length(x) == 1L && !is.na(x)) return(as.integer(x))
  if (is.numeric(x)) return(as_count(x, arg, null_ok = FALSE, call = call, minimum = 0))
  multigpu_abort(sprintf(
    "`%s` must be \"auto\", 0 (silent), 1 (progress bar) or 2 (one line per epoch), not %s.",
    arg, describe(x)
  ), call = call)
}

#' A 1-based epoch (as in keras3) as Keras's 0-based index.
#' @noRd
as_epoch_index <- function(x, arg = caller_arg(x), call = caller_env()) {
  epoch <- as_count(x, arg, null_ok = FALSE, call = call)
  if (epoch < 1L) {
    multigpu_abort(sprintf(
      "`%s` counts from 1 (the first epoch), as in keras3: received %s.",
      arg, describe(x)
    ), call = call)
  }
  epoch - 1L
}

#' `object` must be a Python object (a Keras model) for R to call its methods.
#' @noRd
check_model <- function(object, arg = caller_arg(object), call = caller_env()) {
  if (!inherits(object, "python.builtin.object")) {
    multigpu_abort(sprintf("`%s` must be a Keras model, not %s.", arg,
                           describe(object)),
                   class = "multigpu_type_error", call = call)
  }
  invisible(object)
}

#' Keras callbacks as a list: one callback object is wrapped; R values that
#' are no callback (a number, a string, an R function) are refused.
#' @noRd
as_callbacks <- function(callbacks, arg = caller_arg(callbacks), call = caller_env()) {
  if (is.null(callbacks)) return(NULL)
  if (inherits(callbacks, "python.builtin.object")) {
    if (reticulate::py_has_attr(callbacks, "set_model")) return(list(callbacks))
    return(callbacks)  # a Python list of callbacks
  }
  entries <- if (is.list(callbacks)) callbacks else list(callbacks)
  bad <- which(!vapply(entries, inherits, logical(1), what = "python.builtin.object"))
  if (length(bad)) {
    multigpu_abort(sprintf(
      "`%s` must be a Keras callback or a list of them, such as checkpoint_callbacks(dir) or keras$callbacks$EarlyStopping(); %s is not one.",
      arg, if (is.list(callbacks)) {
        sprintf("entry %d, %s,", bad[[1L]], describe(entries[[bad[[1L]]]]))
      } else {
        describe(callbacks)
      }
    ), class = "multigpu_type_error", call = call)
  }
  callbacks
}

#' `custom_objects`: `NULL`, a Python dict, or a list named by the names
#' the saved model uses (Python would say "'float' object is not a mapping").
#' @noRd
as_custom_objects <- function(x, arg = caller_arg(x), call = caller_env()) {
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  if (!is.list(x) || is.null(names(x)) || anyNA(names(x)) || !all(nzchar(names(x)))) {
    multigpu_abort(sprintf(
      "`%s` must be NULL or a list named by the names the saved model uses, e.g. list(MyLayer = MyLayer); received %s.",
      arg, describe(x)
    ), class = "multigpu_type_error", call = call)
  }
  x
}

#' Refuses an argument that is a single `NA` on its way to Python, where
#' reticulate would turn it into a value: `TRUE` (a logical NA), the string
#' `"NA"` or NaN. The wrappers check the arguments they coerce; this catches
#' the ones passed on as they are (`device_type`, `shard_policy`, ...).
#' @param args The named arguments of a call to `fn` (the core's function,
#'   or a keras3 method).
#' @noRd
check_no_na <- function(args, fn, call = caller_env()) {
  for (name in names(args)) {
    value <- args[[name]]
    if (nzchar(name) && is.atomic(value) && length(value) == 1L && is.na(value)) {
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
