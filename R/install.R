#' Install or update the Python environment multigpu uses
#'
#' Creates (or, when it exists, updates) a Python virtual environment with
#' TensorFlow 2.21, Keras 3.15 and the multigpu Python package this R
#' package carries (the same version), then reports what is installed. It
#' works from any directory: the Python package is part of the R package.
#' The default environment, `r-multigpu` in reticulate's virtualenv root, is
#' the one multigpu finds by itself (see [multigpu_config()]); restart R
#' afterwards if Python was already running.
#'
#' The version requirements come from the Python package's own metadata (its
#' extras): the TensorFlow build for this platform (`tensorflow-cpu` on
#' Linux x86_64 and Windows, `tensorflow` on macOS with Apple silicon and
#' Linux aarch64; TensorFlow 2.21 has no build for Intel Macs), and NumPy < 2
#' when reticulate is older than 1.38 (which cannot use NumPy 2).
#'
#' @param envname Name of the virtual environment (in reticulate's
#'   virtualenv root, `$WORKON_HOME` or `~/.virtualenvs`), or a path to one.
#' @param core The multigpu Python package to install: `NULL` (default) for
#'   the one this R package carries (or the `MULTIGPU_CORE` environment
#'   variable, when set); else a source directory holding its
#'   `pyproject.toml`, a wheel file, or a pip requirement such as
#'   `"multigpu @ file:///path/multigpu-0.1.0-py3-none-any.whl"`.
#' @param python The Python used to create a new environment (3.10 to 3.13);
#'   `NULL` for `python3` on the `PATH`. Ignored when the environment exists.
#' @param gpu `TRUE` to install TensorFlow with CUDA (Linux GPUs) instead of
#'   the CPU build.
#' @param demo `TRUE` (default) to also install scikit-learn, whose bundled
#'   digits data the vignettes train on.
#' @param extra_packages More pip requirements to install, or `NULL`.
#' @param quiet `TRUE` for pip's quiet mode.
#' @returns Invisibly, a list: `python` (the environment's Python),
#'   `created` (`TRUE` when the environment is new), `requirements` (what
#'   was asked of pip) and `versions` (what is installed now).
#' @family multigpu environment
#' @export
#' @examples
#' \dontrun{
#' # Creates ~/.virtualenvs/r-multigpu (or $WORKON_HOME/r-multigpu)
#' multigpu::install_multigpu()
#' }
install_multigpu <- function(envname = "r-multigpu", core = NULL,
                             python = NULL, gpu = FALSE, demo = TRUE,
                             extra_packages = NULL, quiet = FALSE) {
  env_dir <- default_env_dir(as_string(envname, null_ok = FALSE))
  gpu <- isTRUE(as_flag(gpu))
  demo <- isTRUE(as_flag(demo))
  check_platform_has_tensorflow()
  source <- find_core_source(core)
  if (dir.exists(source)) {
    # pip builds a source directory in place; the installed R package may
    # be read-only, so it builds a copy.
    source <- copy_core_source(source)
    on.exit(unlink(dirname(source), recursive = TRUE), add = TRUE)
  }
  requirements <- install_requirements(
    source, gpu = gpu, demo = demo, extra_packages = extra_packages
  )
  env_python <- venv_python(env_dir)
  created <- !file.exists(env_python)
  if (created) {
    base <- base_python(python)
    message(sprintf("Creating the virtual environment %s with Python %s (%s)",
                    env_dir, base$version, base$python))
    run_command(base$python, c("-m", "venv", env_dir), "create the environment")
  } else {
    message(sprintf("Updating the virtual environment %s", env_dir))
  }
  message("Installing: ", paste(requirements, collapse = " "))
  run_command(env_python,
              c("-m", "pip", "install", if (isTRUE(quiet)) "--quiet",
                requirements),
              "install the packages")
  versions <- probe_python(env_python)
  problem <- diagnose(env_python, "install_multigpu()", versions)
  if (!is.null(problem)) {
    multigpu_abort(paste("The environment was installed but is not usable:",
                         problem), class = "multigpu_install_error")
  }
  message(sprintf(
    "Done: %s now has Python %s, TensorFlow %s, Keras %s, NumPy %s and multigpu %s.",
    env_dir, versions[["python"]], versions[["tensorflow"]],
    versions[["keras"]], versions[["numpy"]], versions[["multigpu"]]
  ))
  message(after_install_note(env_python))
  invisible(list(python = env_python, created = created,
                 requirements = requirements, versions = versions))
}

#' The pip requirements install_multigpu() asks for: the core with its
#' extras, which hold every version requirement (pyproject.toml).
#' @noRd
install_requirements <- function(core, gpu = FALSE, demo = TRUE,
                                 extra_packages = NULL,
                                 reticulate_version = utils::packageVersion("reticulate")) {
  extras <- paste(c(if (gpu) "gpu" else "cpu", if (demo) "demo",
                    if (reticulate_version < "1.38") "numpy1"),
                  collapse = ",")
  named <- "^\\s*multigpu\\s*@"
  core_requirement <- if (grepl(named, core)) {
    sub(named, sprintf("multigpu[%s] @", extras), core)
  } else {
    sprintf("%s[%s]", if (file.exists(core)) normalizePath(core) else core,
            extras)
  }
  c(core_requirement, extra_packages)
}

#' Stops where TensorFlow 2.21 has no build (macOS on Intel).
#' @noRd
check_platform_has_tensorflow <- function(sysname = Sys.info()[["sysname"]],
                                          machine = Sys.info()[["machine"]],
                                          call = caller_call()) {
  if (identical(sysname, "Darwin") && machine %in% c("x86_64", "i386")) {
    multigpu_abort(paste(
      "TensorFlow 2.21 has no build for macOS on Intel (x86_64): its last",
      "Intel-Mac release was 2.16, and multigpu needs 2.21. Use a Mac with",
      "Apple silicon, Linux or Windows."
    ), class = "multigpu_install_error", call = call)
  }
  invisible(TRUE)
}

#' The multigpu Python source this R package carries (inst/python).
#' @noRd
bundled_core <- function() {
  system.file("python", package = "multigpu")
}

#' A temporary copy of a core source directory, with what pip needs.
#' @noRd
copy_core_source <- function(dir) {
  target <- file.path(tempfile("multigpu-core-"), "multigpu")
  dir.create(file.path(target, "python"), recursive = TRUE)
  file.copy(file.path(dir, c("pyproject.toml", "README.md")), target)
  file.copy(file.path(dir, "python", "multigpu"), file.path(target, "python"),
            recursive = TRUE)
  unlink(list.files(target, "^__pycache__$|\\.egg-info$", recursive = TRUE,
                    include.dirs = TRUE, full.names = TRUE, all.files = TRUE),
         recursive = TRUE)
  target
}

#' Where the multigpu Python source is: `core`, else MULTIGPU_CORE, else the
#' copy this R package carries.
#' @noRd
find_core_source <- function(core = NULL, call = caller_call()) {
  if (!is.null(core)) {
    core <- as_path(core, "core", call = call)
    requirement <- grepl("@|://", core)
    looks_like_path <- !requirement &&
      (grepl("[/\\\\]", core) || grepl("\\.whl$", core))
    if (looks_like_path && !file.exists(core)) {
      multigpu_abort(sprintf(
        "`core` does not exist: %s. Pass NULL (the Python package this R package carries), a directory holding the multigpu pyproject.toml, a wheel file, or a pip requirement.",
        core
      ), call = call)
    }
    if (dir.exists(core) && !is_core_checkout(core)) {
      multigpu_abort(sprintf(
        "`core` is a directory without the multigpu pyproject.toml: %s. Pass NULL (the Python package this R package carries) or the directory holding pyproject.toml and python/multigpu.",
        core
      ), call = call)
    }
    return(core)
  }
  variable <- Sys.getenv("MULTIGPU_CORE")
  if (nzchar(variable)) return(find_core_source(variable, call = call))
  bundled <- bundled_core()
  if (!is_core_checkout(bundled)) {
    multigpu_abort(paste(
      "This multigpu R package carries no Python package (inst/python is",
      "missing: it was not built with R CMD build from the repository).",
      "Reinstall it from its tarball or repository, or pass core =",
      "\"/path/to/multigpu\" (a checkout of the repository) or a wheel file."
    ), class = "multigpu_install_error", call = call)
  }
  bundled
}

is_core_checkout <- function(dir) {
  pyproject <- file.path(dir, "pyproject.toml")
  nzchar(dir) && file.exists(pyproject) &&
    any(grepl("^name\\s*=\\s*\"multigpu\"", readLines(pyproject, warn = FALSE)))
}

#' The Python that creates a new environment, checked.
#' @noRd
base_python <- function(python = NULL, call = caller_call()) {
  python <- if (is.null(python)) {
    unname(Sys.which(c("python3", "python")))[nzchar(Sys.which(c("python3", "python")))][1]
  } else {
    as_python_executable(as_path(python, "python", call = call))
  }
  if (is.na(python) || !file.exists(python)) {
    multigpu_abort(sprintf(
      "No Python to create the environment with: %s. Install Python %s, or pass python = \"/path/to/python3\".",
      if (is.na(python)) "python3 is not on the PATH" else paste(python, "does not exist"),
      core_python_range()$text
    ), class = "multigpu_install_error", call = call)
  }
  versions <- probe_python(python)
  version <- if (is.null(names(versions))) NA_character_ else versions[["python"]]
  if (!is_supported_python(version)) {
    multigpu_abort(sprintf(
      "The Python %s is %s; TensorFlow 2.21 needs Python %s. Pass python = \"/path/to/python3.11\" (or another supported version).",
      python, if (is.na(version)) "not runnable" else paste("version", version),
      core_python_range()$text
    ), class = "multigpu_install_error", call = call)
  }
  list(python = python, version = versions[["python"]])
}

run_command <- function(command, args, what, call = caller_call()) {
  status <- system2(command, shQuote(args), env = python_subprocess_env())
  if (!identical(as.integer(status), 0L)) {
    multigpu_abort(sprintf(
      "Could not %s: `%s %s` exited with status %s (see its output above).",
      what, command, paste(args, collapse = " "), status
    ), class = "multigpu_install_error", call = call)
  }
  invisible(status)
}

after_install_note <- function(env_python) {
  # Until Python starts, the next session applies the rules afresh (the
  # new environment may be the one they find now).
  current <- if (reticulate::py_available(initialize = FALSE)) {
    .globals$choice %||% find_python()
  } else {
    find_python()
  }
  chosen <- current$python
  # Compare the environments, not the executables: a virtual environment's
  # python is a symbolic link to its base Python.
  same_env <- function(a, b) {
    identical(normalizePath(dirname(a), mustWork = FALSE),
              normalizePath(dirname(b), mustWork = FALSE))
  }
  if (!is.null(chosen) && same_env(chosen, env_python)) {
    note <- sprintf("multigpu will use it (chosen by %s).", current$source)
  } else if (is.null(chosen)) {
    note <- sprintf(
      "To use it, set Sys.setenv(MULTIGPU_PYTHON = \"%s\") before library(multigpu).",
      env_python)
  } else {
    note <- sprintf(
      "Note: %s chooses %s first; to use this environment, set Sys.setenv(MULTIGPU_PYTHON = \"%s\") (and unset RETICULATE_PYTHON) before library(multigpu).",
      current$source, chosen, env_python)
  }
  if (reticulate::py_available(initialize = FALSE)) {
    note <- paste(note, "Python is already running in this R session: restart R first.")
  }
  note
}
