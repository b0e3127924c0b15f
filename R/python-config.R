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
#' 6. Otherwise, with reticulate >= 1.41 (unless `RETICULATE_USE_MANAGED_VENV`
#'    is `"no"`; `RETICULATE_PYTHON = "managed"` asks for it outright):
#'    zero set-up. Loading multigpu declares with `reticulate::py_require()`
#'    what it needs, read from the `pyproject.toml` the package carries: the
#'    multigpu Python package itself (the copy in the R package, as a local
#'    path), Keras and NumPy in the tested ranges, the supported Python
#'    versions, and TensorFlow 2.21. keras3 (and tensorflow) declare
#'    TensorFlow too, choosing the GPU or CPU build: multigpu then adds only
#'    the version, `==2.21.*`, to the distribution they declared, never a
#'    second one; alone, it declares the build of its `cpu` extra for this
#'    platform (`gpu` on Linux with an NVIDIA GPU). The first call that needs
#'    Python has reticulate create the environment with `uv` (minutes the
#'    first time, then cached) and start Python in it.
#' 7. With older reticulate (Debian's 1.28 among them): reticulate's own
#'    discovery, which prefers a Python that has the `multigpu` module; when
#'    it finds none, the first call says to run [install_multigpu()].
#'
#' multigpu passes the choice of rules 3 to 5 on to reticulate by setting
#' `RETICULATE_PYTHON` for the session. `multigpu_config()` never starts
#' Python: in case 6 before the environment exists it reports it as not
#' created yet, and lists the requirements multigpu declared;
#' `is_multigpu_available()` has reticulate create it (and starts Python).
#' When reticulate cannot (no `uv` and no way to download it, no Python
#' 3.10-3.13 for `uv` to use, a package without a build for this platform,
#' such as TensorFlow 2.21 on an Intel Mac), the first call signals a
#' `multigpu_unavailable_error` saying why and what to do.
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
#'   `keras`, `multigpu`; `NA` for what is missing), `available`,
#'   `pending` (`TRUE` while reticulate has yet to create the py_require()
#'   environment), `requirements` (what multigpu declared with
#'   `py_require()`, or `NULL`) and `problem` (`NULL`, or the message the
#'   first call would give).
#'   `is_multigpu_available()`: `TRUE` or `FALSE` (in case 6 it first has
#'   reticulate create the environment).
#' @family multigpu environment
#' @export
#' @examples
#' multigpu_config()
#' is_multigpu_available()
multigpu_config <- function() {
  status <- python_status(provision = FALSE)
  pending <- isTRUE(status$pending)
  structure(
    list(python = status$python, source = status$source,
         versions = status$versions,
         available = is.null(status$problem) && !pending,
         pending = pending,
         requirements = .globals$declared,
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
  if (length(x$requirements)) {
    line("declared:", paste(x$requirements, collapse = ", "))
  }
  if (x$available) {
    line("status:", "ready")
  } else if (isTRUE(x$pending) && is.null(x$problem)) {
    line("status:", paste(
      "not created yet: reticulate creates it (with uv) at the first call",
      "that needs Python, or now with is_multigpu_available()"))
  } else {
    line("status:", "not usable")
    cat("\n", x$problem, "\n", sep = "")
  }
  invisible(x)
}

#' The Python multigpu uses now, the rule that chose it, and what is wrong.
#' Cached per Python path for the session.
#'
#' @param provision In the py_require() case before Python runs: `TRUE` to
#'   have reticulate create the environment and start Python in it (the
#'   first call that needs Python), `FALSE` to report it as pending.
#' @noRd
python_status <- function(provision = TRUE) {
  choice <- .globals$choice %||% find_python()
  managed <- isTRUE(choice$managed)
  fix <- fix_text
  if (reticulate::py_available(initialize = FALSE)) {
    config <- reticulate::py_config()
    python <- config$python
    source <- "the Python already running in this R session"
    if (managed && isTRUE(config$ephemeral)) {
      source <- choice$source
      fix <- managed_fix_text
    }
  } else {
    python <- choice$python
    source <- choice$source
    if (is.null(python)) {
      config <- tryCatch(reticulate::py_discover_config("multigpu"),
                         error = function(e) NULL)
      python <- config$python
      if (managed && is.null(python)) {
        if (!provision) return(pending_status(choice$source))
        problem <- provision_python()
        if (!is.null(problem)) {
          return(list(python = NULL, source = choice$source,
                      versions = character(), problem = problem))
        }
        return(python_status(provision = FALSE))
      }
      if (managed) {
        source <- paste("reticulate's discovery (it found this Python",
                        "before creating an environment from py_require())")
      }
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
  problem <- diagnose(python, source, versions, fix = fix)
  status <- list(python = python, source = source,
                 versions = if (is.null(names(versions))) character() else versions,
                 problem = problem)
  .globals$status[[key]] <- status
  status
}

#' The status before reticulate has created the py_require() environment.
#' @noRd
pending_status <- function(source) {
  list(python = NULL, source = source, versions = character(),
       problem = .globals$requirements_problem, pending = TRUE)
}
