# Choosing the Python multigpu uses, by the rules documented in
# ?multigpu_config. Runs in .onLoad and never starts Python.

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
  if (identical(reticulate_python, "managed") && reticulate_provisions()) {
    return(list(python = NULL, managed = TRUE,
                source = paste("RETICULATE_PYTHON=managed: reticulate's",
                               "environment from py_require()")))
  }
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
  if (reticulate_provisions()) {
    return(list(python = NULL, managed = TRUE, source = managed_source))
  }
  list(python = NULL, source = "reticulate's default discovery")
}

managed_source <- paste(
  "reticulate's environment from py_require() (no RETICULATE_PYTHON,",
  "MULTIGPU_PYTHON, multigpu.python, r-multigpu environment or .venv;",
  "reticulate >= 1.41 creates it with uv)"
)

#' Whether reticulate creates an environment from py_require() declarations
#' when nothing else chose a Python: reticulate >= 1.41, unless the user
#' opted out with RETICULATE_USE_MANAGED_VENV=no.
#' @noRd
reticulate_provisions <- function(reticulate_version = utils::packageVersion("reticulate")) {
  reticulate_version >= "1.41" &&
    !tolower(Sys.getenv("RETICULATE_USE_MANAGED_VENV")) %in% c("false", "0", "no")
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
