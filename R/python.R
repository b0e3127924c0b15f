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

# ---- choosing the Python (runs in .onLoad, never starts Python) ----

venv_python <- function(dir) {
  if (.Platform$OS.type == "windows") {
    file.path(dir, "Scripts", "python.exe")
  } else {
    file.path(dir, "bin", "python")
  }
}

# A Python executable from a path that may be a virtual environment.
as_python_executable <- function(path) {
  path <- path.expand(path)
  if (dir.exists(path)) venv_python(path) else path
}

#' The directory of the virtual environment `install_multigpu()` manages.
#' @noRd
default_env_dir <- function(envname = "r-multigpu") {
  if (grepl("[/\\\\]", envname)) return(path.expand(envname))
  root <- Sys.getenv("WORKON_HOME", unset = "~/.virtualenvs")
  file.path(path.expand(root), envname)
}

#' Apply the discovery rules; returns list(python, source), python NULL when
#' reticulate's discovery decides.
#' @noRd
find_python <- function(wd = getwd()) {
  reticulate_python <- Sys.getenv("RETICULATE_PYTHON")
  if (nzchar(reticulate_python)) {
    return(list(python = reticulate_python,
                source = "the RETICULATE_PYTHON environment variable"))
  }
  option <- getOption("multigpu.python")
  if (!is.null(option)) {
    return(list(python = as_python_executable(option),
                source = "the R option multigpu.python"))
  }
  variable <- Sys.getenv("MULTIGPU_PYTHON")
  if (nzchar(variable)) {
    return(list(python = as_python_executable(variable),
                source = "the MULTIGPU_PYTHON environment variable"))
  }
  env_python <- venv_python(default_env_dir())
  if (file.exists(env_python)) {
    return(list(python = env_python,
                source = "the environment install_multigpu() created"))
  }
  dir <- normalizePath(wd, mustWork = FALSE)
  repeat {
    candidate <- venv_python(file.path(dir, ".venv"))
    if (file.exists(candidate)) {
      return(list(python = candidate,
                  source = sprintf("the .venv in %s", dir)))
    }
    parent <- dirname(dir)
    if (identical(parent, dir)) break
    dir <- parent
  }
  list(python = NULL, source = "reticulate's default discovery")
}

#' Record the Python multigpu will use and make reticulate use it.
#'
#' The choice is passed on as `RETICULATE_PYTHON`, which reticulate obeys
#' before anything else (a `pyproject.toml` in the working directory would
#' otherwise send reticulate 1.28 looking for Poetry).
#' @noRd
select_python <- function() {
  if (reticulate::py_available(initialize = FALSE)) return(invisible())
  choice <- find_python()
  .globals$choice <- choice
  python <- choice$python
  if (!is.null(python) && file.exists(python) &&
      !nzchar(Sys.getenv("RETICULATE_PYTHON"))) {
    Sys.setenv(RETICULATE_PYTHON = python)
  }
  invisible()
}

# ---- checking it (in a subprocess, so Python need not start) ----

probe_code <- paste(
  "import sys, importlib.util, importlib.metadata as md",
  "def v(mod, dists):",
  "    try:",
  "        if importlib.util.find_spec(mod) is None: return ''",
  "    except Exception: return ''",
  "    for d in dists:",
  "        try: return md.version(d)",
  "        except Exception: pass",
  "    return 'unknown'",
  "print('python=' + '.'.join(map(str, sys.version_info[:3])))",
  "print('numpy=' + v('numpy', ['numpy']))",
  "print('tensorflow=' + v('tensorflow', ['tensorflow', 'tensorflow-cpu', 'tensorflow-intel', 'tensorflow-macos', 'tf-nightly', 'tf-nightly-cpu']))",
  "print('keras=' + v('keras', ['keras', 'keras-nightly']))",
  # The version of the multigpu module Python imports (on PYTHONPATH or
  # installed), read from its source: its __version__ line.
  "def core_version():",
  "    import re",
  "    try: spec = importlib.util.find_spec('multigpu')",
  "    except Exception: return ''",
  "    if spec is None or not spec.origin: return ''",
  "    with open(spec.origin, encoding='utf-8') as f: text = f.read()",
  "    found = re.search(r'^__version__ = [\"\\']([^\"\\']+)', text, re.M)",
  "    return found.group(1) if found else 'unknown'",
  "print('multigpu=' + core_version())",
  sep = "\n"
)

#' The environment for a Python subprocess: `LD_LIBRARY_PATH` without the
#' directories R's start-up script put first.
#'
#' R prepends its own and the system's library directories to
#' `LD_LIBRARY_PATH`; a Python built with a shared libpython (pyenv's, for
#' one) would then load the system's libpython instead of its own: another
#' version, without its `ssl` module, so that pip cannot download. The
#' system directories are searched anyway, after the program's own.
#' @noRd
python_subprocess_env <- function(ld_library_path = Sys.getenv("LD_LIBRARY_PATH")) {
  if (.Platform$OS.type != "unix" || !nzchar(ld_library_path)) return(character())
  entries <- strsplit(ld_library_path, ":", fixed = TRUE)[[1]]
  r_lib <- normalizePath(R.home("lib"), mustWork = FALSE)
  added_by_r <- entries == R.home("lib") |
    normalizePath(entries, mustWork = FALSE) == r_lib |
    grepl("^(/usr)?/lib(32|64)?(/[^/]+-linux-gnu[^/]*)?/?$", entries) |
    grepl("/jvm/.*/lib(/server)?/?$", entries) | !nzchar(entries)
  paste0("LD_LIBRARY_PATH=", shQuote(paste(entries[!added_by_r], collapse = ":")))
}

#' Versions of what multigpu needs in `python`, read without importing.
#'
#' @returns A named character vector (`NA` = not installed), or a string
#'   (the output) when the Python could not be run.
#' @noRd
probe_python <- function(python) {
  output <- suppressWarnings(tryCatch(
    system2(python, c("-c", shQuote(probe_code)), stdout = TRUE,
            stderr = TRUE, timeout = 120, env = python_subprocess_env()),
    error = function(e) conditionMessage(e)
  ))
  status <- attr(output, "status") %||% 0L
  fields <- grep("^[a-z]+=", output, value = TRUE)
  if (status != 0L || length(fields) < 5L) {
    return(paste(output, collapse = "\n"))
  }
  versions <- sub("^[a-z]+=", "", fields)
  names(versions) <- sub("=.*$", "", fields)
  versions[versions == ""] <- NA_character_
  versions
}

fix_text <- paste0(
  "Fix: run multigpu::install_multigpu() and restart R (it creates the ",
  "'r-multigpu' environment with TensorFlow 2.21, Keras 3 and the ",
  "multigpu Python package, which multigpu then finds by itself), or ",
  "point R at a Python that has them with ",
  "Sys.setenv(MULTIGPU_PYTHON = \"/path/to/python\") before ",
  "library(multigpu)."
)

#' The Python versions the core supports, read from its pyproject.toml
#' (`requires-python = ">=3.10,<3.14"`), where they are written once.
#'
#' @returns A list: `min` and `below` (`numeric_version`s) and `text`
#'   (`"3.10 to 3.13"`).
#' @noRd
core_python_range <- function(pyproject = file.path(bundled_core(), "pyproject.toml")) {
  lines <- readLines(pyproject, warn = FALSE)
  line <- grep("^requires-python\\s*=", lines, value = TRUE)[[1]]
  min <- sub(".*>=\\s*([0-9.]+).*", "\\1", line)
  below <- numeric_version(sub(".*<\\s*([0-9.]+).*", "\\1", line))
  last <- sprintf("%s.%d", below[[1, 1]], below[[1, 2]] - 1L)
  list(min = numeric_version(min), below = below,
       text = sprintf("%s to %s", min, last))
}

#' What is wrong with a Python for multigpu, or NULL when nothing is.
#'
#' @param versions The result of `probe_python()`.
#' @noRd
diagnose <- function(python, source, versions,
                     reticulate_version = utils::packageVersion("reticulate"),
                     r_package_version = as.character(utils::packageVersion("multigpu"))) {
  where <- sprintf("(chosen by %s)", source)
  if (is.null(python) || !nzchar(python)) {
    return(sprintf("No Python was found for multigpu %s. %s", where,
                   fix_text))
  }
  if (!file.exists(python)) {
    return(sprintf("%s points to %s, which does not exist. %s",
                   capitalise(source), python, fix_text))
  }
  if (is.character(versions) && is.null(names(versions))) {
    return(sprintf("The Python %s %s could not be run: %s\n%s",
                   python, where, versions, fix_text))
  }
  version <- numeric_version(versions[["python"]], strict = FALSE)
  supported <- core_python_range()
  if (is.na(version) || version < supported$min || version >= supported$below) {
    return(sprintf(
      "The Python %s %s is version %s; multigpu needs Python %s (TensorFlow 2.21 supports no other). %s",
      python, where, versions[["python"]], supported$text, fix_text
    ))
  }
  numpy <- versions[["numpy"]]
  if (is.na(numpy)) {
    return(sprintf("NumPy is not installed in the Python %s %s. %s",
                   python, where, fix_text))
  }
  numpy_version <- numeric_version(numpy, strict = FALSE)
  if (!is.na(numpy_version) && numpy_version >= "2" &&
      reticulate_version < "1.38") {
    return(sprintf(paste(
      "NumPy %s is installed in the Python %s %s, but reticulate %s",
      "(the R-Python bridge of this R) only works with NumPy < 2; NumPy 2",
      "needs reticulate >= 1.38. Fix: run multigpu::install_multigpu()",
      "(which installs NumPy < 2 for this reticulate) and restart R, or",
      "upgrade reticulate to 1.38 or later."
    ), numpy, python, where, reticulate_version))
  }
  if (is.na(versions[["tensorflow"]])) {
    return(sprintf("TensorFlow is not installed in the Python %s %s. %s",
                   python, where, fix_text))
  }
  keras <- numeric_version(versions[["keras"]], strict = FALSE)
  if (is.na(versions[["keras"]]) || (!is.na(keras) && keras < "3")) {
    return(sprintf(
      "multigpu needs Keras 3 but the Python %s %s has %s. %s",
      python, where,
      if (is.na(versions[["keras"]])) "no Keras" else
        paste("Keras", versions[["keras"]]),
      fix_text
    ))
  }
  if (is.na(versions[["multigpu"]])) {
    return(sprintf(
      "The multigpu Python package is not installed in the Python %s %s. %s",
      python, where, fix_text
    ))
  }
  if (!identical(versions[["multigpu"]], r_package_version)) {
    return(structure(sprintf(paste(
      "The Python %s %s has the multigpu Python package %s, but this R",
      "package is multigpu %s: the two must be the same version. Fix: run",
      "multigpu::install_multigpu() (it installs the Python package this R",
      "package carries) and restart R."
    ), python, where, versions[["multigpu"]], r_package_version),
    class = "multigpu_version_mismatch"))
  }
  NULL
}

capitalise <- function(text) {
  paste0(toupper(substr(text, 1L, 1L)), substring(text, 2L))
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

#' The multigpu Python module, after checking that it can work.
#'
#' The first call checks the Python (see ?multigpu_config) and imports the
#' module; a problem becomes a `multigpu_unavailable_error`.
#' @noRd
core <- function(call = caller_call()) {
  if (!isTRUE(.globals$ready)) {
    status <- python_status()
    if (!is.null(status$problem)) {
      multigpu_abort(
        as.character(status$problem),
        class = c(if (inherits(status$problem, "multigpu_version_mismatch"))
                    "multigpu_version_error",
                  "multigpu_unavailable_error"),
        call = call
      )
    }
    tryCatch(
      reticulate::import("multigpu"),
      error = function(error) {
        multigpu_abort(sprintf(
          "Importing the multigpu Python package from %s failed: %s\n%s",
          status$python, conditionMessage(error), fix_text
        ), class = "multigpu_unavailable_error", call = call)
      }
    )
    .globals$ready <- TRUE
  }
  .globals$core
}

#' The Python `keras` module (after the same checks as `core()`).
#' @noRd
keras_module <- function(call = caller_call()) {
  core(call = call)
  .globals$keras
}
