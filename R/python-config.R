#' How multigpu finds Python, and what it found
#'
#' `multigpu_config()` reports which Python R uses for multigpu, why that one,
#' and the versions of what multigpu needs in it, without starting Python.
#' `is_multigpu_available()` is `TRUE` when that Python has everything.
#'
#' @section How the Python environment is found:
#' When the package loads, before Python starts, the first rule that applies
#' picks the Python:
#'
#' 1. Python is already running in this R session (something used
#'    reticulate before): that one; it cannot be changed without restarting R.
#' 2. The `RETICULATE_PYTHON` environment variable: reticulate's own rule.
#' 3. The R option `multigpu.python` or the environment variable
#'    `MULTIGPU_PYTHON`: a Python executable or a virtual environment
#'    directory.
#' 4. The virtual environment [install_multigpu()] creates: `r-multigpu`
#'    in reticulate's virtualenv root (`$WORKON_HOME`, by default
#'    `~/.virtualenvs/r-multigpu`), if it exists.
#' 5. A `.venv` directory in the working directory or one of its parents
#'    (a multigpu checkout set up with `make setup`).
#' 6. Otherwise reticulate's own discovery, which prefers a Python that has
#'    the `multigpu` module.
#'
#' multigpu passes the choice of rules 3 to 5 on to reticulate by setting
#' `RETICULATE_PYTHON` for the session.
#'
#' Loading the package never fails because of Python. The first call that
#' needs Python checks it (without starting it) and, when something is
#' missing or incompatible, signals a `multigpu_unavailable_error` that says
#' what is wrong and how to fix it: no Python at the chosen path, Python
#' outside 3.10-3.13, TensorFlow, Keras 3 or the multigpu Python package
#' missing or of another version than the R package (then the error is also
#' a `multigpu_version_error`), or NumPy 2 with reticulate < 1.38 (which only works with
#' NumPy < 2).
#'
#' @returns `multigpu_config()`: a list of class `multigpu_config` with
#'   `python` (the executable), `source` (the rule that chose it),
#'   `versions` (a named character vector: `python`, `numpy`, `tensorflow`,
#'   `keras`, `multigpu`; `NA` for what is missing), `available` and
#'   `problem` (`NULL`, or the message the first call would give).
#'   `is_multigpu_available()`: `TRUE` or `FALSE`.
#' @family multigpu environment
#' @export
#' @examples
#' multigpu_config()
#' is_multigpu_available()
multigpu_config <- function() {
  status <- python_status()
  structure(
    list(python = status$python, source = status$source,
         versions = status$versions, available = is.null(status$problem),
         problem = if (!is.null(status$problem)) as.character(status$problem)),
    class = "multigpu_config"
  )
}

#' @rdname multigpu_config
#' @export
is_multigpu_available <- function() {
  is.null(python_status()$problem)
}

#' @export
print.multigpu_config <- function(x, ...) {
  line <- function(label, value) cat(sprintf("  %-11s %s\n", label, value))
  cat("multigpu Python environment\n")
  line("executable:", x$python %||% "(none found)")
  line("chosen by:", x$source)
  versions <- x$versions
  for (name in names(versions)) {
    line(paste0(name, ":"),
         if (is.na(versions[[name]])) "not installed" else versions[[name]])
  }
  if (x$available) {
    line("status:", "ready")
  } else {
    line("status:", "not usable")
    cat("\n", x$problem, "\n", sep = "")
  }
  invisible(x)
}

#' The Python multigpu uses now, the rule that chose it, and what is wrong.
#' Cached per Python path for the session.
#' @noRd
python_status <- function() {
  if (reticulate::py_available(initialize = FALSE)) {
    python <- reticulate::py_config()$python
    source <- "the Python already running in this R session"
  } else {
    choice <- .globals$choice %||% find_python()
    python <- choice$python
    source <- choice$source
    if (is.null(python)) {
      config <- tryCatch(reticulate::py_discover_config("multigpu"),
                         error = function(e) NULL)
      python <- config$python
    }
  }
  key <- python %||% ""
  cached <- .globals$status[[key]]
  if (!is.null(cached) && identical(cached$source, source)) return(cached)
  versions <- if (!is.null(python) && file.exists(python)) {
    probe_python(python)
  } else {
    character()
  }
  problem <- diagnose(python, source, versions)
  status <- list(python = python, source = source,
                 versions = if (is.null(names(versions))) character() else versions,
                 problem = problem)
  .globals$status[[key]] <- status
  status
}
