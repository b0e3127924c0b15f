# The Python side, set up as keras3 sets up its own: requirements declared
# with reticulate::py_require() when the package loads, versions pinned by a
# uv constraints file, and one check at the first call that needs Python.

# The Python versions the core supports. tests/python/test_install.py
# checks this, and inst/python/constraints.txt, against pyproject.toml.
supported_python <- ">=3.10,<3.14"

#' Declare what multigpu needs with `py_require()`.
#'
#' The core this package carries (as a local path), with the extras of the
#' Keras backend (`jax` on JAX, whose tested range pyproject.toml holds),
#' the Python versions it supports, and `inst/python/constraints.txt`
#' appended to `UV_CONSTRAINT`, which pins TensorFlow, Keras and NumPy to
#' the tested releases without naming a TensorFlow distribution: keras3
#' (imported, so loaded first) has declared the one for this machine (the
#' CPU build, or CUDA's on Linux with an NVIDIA GPU), and on JAX its JAX
#' build. Declarations only count before Python starts: this runs when the
#' package loads and again before the core's first call starts Python, so
#' that a `keras3::use_backend()` between the two is followed (the last
#' backend wins, as in keras3).
#' @noRd
declare_python_requirements <- function() {
  if (reticulate::py_available(initialize = FALSE)) return(invisible(FALSE))
  constraints <- system.file("python", "constraints.txt", package = "multigpu")
  current <- Sys.getenv("UV_CONSTRAINT")
  if (!grepl(constraints, current, fixed = TRUE)) {
    Sys.setenv(UV_CONSTRAINT = trimws(paste(current, constraints)))
  }
  wanted <- core_requirement(backend_extras())
  declared <- reticulate::py_require()$packages
  if (wanted %in% declared) return(invisible(TRUE))
  # The core declared for another backend.
  stale <- grep("^multigpu(\\[[^]]*\\])? @ ", declared, value = TRUE)
  if (length(stale)) reticulate::py_require(stale, action = "remove")
  reticulate::py_require(wanted, python_version = supported_python)
  invisible(TRUE)
}

#' The Keras backend keras3 chose: its `use_backend()` (and its load hook,
#' with `"tensorflow"` unless told otherwise) sets `KERAS_BACKEND`.
#' @noRd
keras_backend <- function() {
  sub("-(cpu|gpu)$", "", Sys.getenv("KERAS_BACKEND", unset = "tensorflow"))
}

#' The core's extras that `backend` needs: `jax` on JAX (JAX itself, in the
#' range the core is tested with), none on TensorFlow, whose distribution
#' keras3 declares.
#' @noRd
backend_extras <- function(backend = keras_backend()) {
  if (identical(backend, "jax")) "jax" else character()
}

#' The core as a requirement: `"multigpu @ file:///..."`, or with `extras`
#' such as `c("cpu", "demo")` (for pip).
#' @noRd
core_requirement <- function(extras = character()) {
  path <- normalizePath(cached_core(), winslash = "/")
  sprintf("multigpu%s @ %s%s",
          if (length(extras)) sprintf("[%s]", paste(extras, collapse = ",")) else "",
          if (startsWith(path, "/")) "file://" else "file:///", path)
}

#' A copy of the core this package carries (`inst/python`), in the user's
#' cache: building a source tree writes into it, and an installed package
#' may be read-only. The name holds the version and a digest of the files,
#' so a changed core is a new path for uv's cache.
#' @noRd
cached_core <- function(cache = tools::R_user_dir("multigpu", "cache")) {
  source <- system.file("python", package = "multigpu")
  files <- c("pyproject.toml", "README.md",
             file.path("python", list.files(file.path(source, "python"),
                                            recursive = TRUE)))
  files <- sort(files[!grepl("__pycache__|egg-info|\\.pyc$", files)])
  digest <- tools::md5sum(file.path(source, files))
  listing <- tempfile()
  on.exit(unlink(listing))
  writeLines(paste(files, digest), listing)
  key <- substr(unname(tools::md5sum(listing)), 1L, 12L)
  target <- file.path(cache, sprintf("core-%s-%s", utils::packageVersion("multigpu"), key))
  if (!file.exists(file.path(target, "pyproject.toml"))) {
    for (dir in unique(dirname(file.path(target, files)))) dir.create(dir, recursive = TRUE, showWarnings = FALSE)
    file.copy(file.path(source, files), file.path(target, files), overwrite = TRUE)
  }
  target
}

#' Start Python and check what multigpu needs in it.
#'
#' @returns `NULL` when all is well, else the problem: a message naming the
#'   fix, with class `multigpu_version_mismatch` when only the core's
#'   version differs from the R package's.
#' @noRd
python_problem <- function() {
  started <- tryCatch({ start_python(); NULL },
                      error = function(e) conditionMessage(e))
  if (!is.null(started)) return(start_problem(started))
  versions_problem(python_versions(), reticulate::py_exe())
}

#' Start Python (`reticulate::py_config()`), without reticulate's report of
#' a C stack overflow that it recovers from.
#'
#' reticulate 1.46 builds its uv environment while it starts Python. Where
#' uv lists no Python of its own (`UV_PYTHON_DOWNLOADS=never`, none
#' installed), reticulate's search for a Python to start from asks for the
#' Python being started, which resolves the environment again, until R's C
#' stack limit stops the recursion. A `try()` inside reticulate then prints
#' "Error : C stack usage ... is too close to the limit", and reticulate
#' goes on to find the environment. What its `try()` calls print goes
#' through the `try.outFile` option: here a text connection, from which every
#' line but that one reaches stderr once Python has started (or failed to).
#' `start` is the call that starts Python.
#' @noRd
start_python <- function(start = reticulate::py_config) {
  printed <- character()
  connection <- textConnection("printed", "w", local = TRUE)
  previous <- options(try.outFile = connection)
  on.exit({
    options(previous)
    close(connection)
    kept <- printed[!is_recovered_stack_overflow(printed)]
    if (length(kept)) writeLines(kept, stderr())
  }, add = TRUE)
  start()
}

#' Whether lines are reticulate's report of the C stack overflow that
#' `start_python()` leaves out.
#' @noRd
is_recovered_stack_overflow <- function(lines) {
  grepl("^Error : C stack usage +[0-9]+ is too close to the limit$", lines)
}

#' What is wrong with the `versions` (from `python_versions()`) of `python`
#' for multigpu, or `NULL`.
#' @noRd
versions_problem <- function(versions, python,
                             package = as.character(utils::packageVersion("multigpu"))) {
  where <- sprintf("The Python multigpu uses (%s)", python)
  fix <- paste("Fix: restart R with nothing chosen (no RETICULATE_PYTHON or",
               "MULTIGPU_PYTHON) so that reticulate builds the environment",
               "multigpu declares, or run install_multigpu() and restart R.")
  bounds <- regmatches(supported_python, gregexpr("[0-9.]+", supported_python))[[1]]
  version <- numeric_version(versions[["python"]])
  if (version < bounds[[1]] || version >= bounds[[2]]) {
    return(sprintf("%s is Python %s; multigpu needs Python %s. %s", where,
                   versions[["python"]], supported_python, fix))
  }
  # On JAX, multigpu needs no TensorFlow (keras3 declares it for tf.data).
  jax <- "jax" %in% names(versions)
  needed <- c(if (!jax) "tensorflow", "keras", "multigpu", if (jax) "jax")
  for (name in needed) {
    if (is.na(versions[[name]])) {
      return(sprintf("%s has no %s package%s. %s", where, name,
                     if (name == "jax") paste(
                       ", which the JAX backend (keras3::use_backend(\"jax\"))",
                       "needs") else "", fix))
    }
  }
  if (!is.na(versions[["tensorflow"]]) &&
      !startsWith(versions[["tensorflow"]], "2.21.")) {
    return(sprintf("%s has TensorFlow %s; multigpu needs TensorFlow 2.21. %s",
                   where, versions[["tensorflow"]], fix))
  }
  if (!identical(versions[["multigpu"]], package)) {
    return(structure(sprintf(paste(
      "%s has the multigpu Python package %s, but this R package is",
      "multigpu %s: the two must be the same version. %s"
    ), where, versions[["multigpu"]], package, fix),
    class = "multigpu_version_mismatch"))
  }
  NULL
}

#' Versions in the running Python, read from package metadata (nothing is
#' imported, so TensorFlow's devices stay unconfigured); JAX's too on the
#' JAX backend.
#' @noRd
python_versions <- function(backend = keras_backend()) {
  metadata <- reticulate::import("importlib.metadata")
  version_of <- function(...) {
    for (distribution in c(...)) {
      found <- tryCatch(metadata$version(distribution), error = function(e) NULL)
      if (!is.null(found)) return(found)
    }
    NA_character_
  }
  c(python = paste(reticulate::py_eval("__import__('sys').version_info[:3]"),
                   collapse = "."),
    numpy = version_of("numpy"),
    tensorflow = version_of("tensorflow", "tensorflow-cpu", "tensorflow-macos",
                            "tensorflow-intel"),
    keras = version_of("keras"),
    multigpu = version_of("multigpu"),
    jax = if (identical(backend, "jax")) version_of("jax"))
}

#' Why reticulate could not start Python, and the fix.
#' @noRd
start_problem <- function(details, uv = has_uv(),
                          machine = Sys.info()[c("sysname", "machine")]) {
  start <- paste("reticulate could not start Python for multigpu:", details)
  alternative <- paste("Or run install_multigpu() (it creates the",
                       "'r-multigpu' environment with pip) and restart R.")
  if (identical(machine[["sysname"]], "Darwin") &&
      machine[["machine"]] %in% c("x86_64", "i386")) {
    return(paste(start, "\nTensorFlow 2.21 has no build for macOS on Intel",
                 "(its last was 2.16). Use a Mac with Apple silicon, Linux or",
                 "Windows."))
  }
  if (!uv) {
    return(paste(start, "\nreticulate builds multigpu's environment with uv,",
                 "which is not installed and could not be downloaded. Fix:",
                 "install uv (`pip install uv`, or",
                 "https://docs.astral.sh/uv/getting-started/installation/) and",
                 "restart R.", alternative))
  }
  if (grepl("Python version|interpreter", details)) {
    return(paste(start, "\nuv found no Python", supported_python, "(which",
                 "TensorFlow 2.21 needs) and could not download one. Fix:",
                 "install Python 3.11 (or another of those versions), or let",
                 "uv download one (unset UV_PYTHON_DOWNLOADS), and restart R.",
                 alternative))
  }
  paste(start, "\nFix: see reticulate::py_require() for what each package",
        "asked, change what conflicts, and restart R.", alternative)
}

#' Whether uv is where reticulate looks for it.
#' @noRd
has_uv <- function() {
  candidates <- c(Sys.getenv("RETICULATE_UV"), Sys.which("uv"),
                  path.expand("~/.local/bin/uv"),
                  file.path(tools::R_user_dir("reticulate", "cache"), "uv",
                            "bin", "uv"))
  any(nzchar(candidates) & file.exists(candidates))
}

#' multigpu's Python environment
#'
#' `multigpu_config()` starts Python (reticulate builds the environment
#' that keras3 and multigpu declared, the first time, with uv) and reports
#' which Python it is and the versions of what multigpu needs there.
#' `is_multigpu_available()` is `TRUE` when all of it is usable.
#'
#' Python is chosen by reticulate's rules. Loading multigpu forwards the
#' `MULTIGPU_PYTHON` environment variable to `RETICULATE_PYTHON`, as keras3
#' forwards `KERAS_PYTHON`. Without either, an `r-multigpu` environment
#' (from [install_multigpu()]) is used when it exists; otherwise reticulate
#' builds one from the `py_require()` declarations: keras3's TensorFlow for
#' this machine, and the multigpu Python package this R package carries, with
#' TensorFlow 2.21, Keras 3.15 and NumPy 2 pinned by the package's constraints
#' file. On the JAX backend (`keras3::use_backend("jax")`, called before
#' Python starts) keras3 declares JAX, and multigpu its `jax` extra, which
#' holds JAX to the range multigpu is tested with and adds no TensorFlow:
#' multigpu on JAX runs without it (keras3 declares TensorFlow's CPU build
#' for its own `tf.data` support). When something is wrong the first call signals a
#' `multigpu_unavailable_error` naming the fix (a `multigpu_version_error`
#' too when only the core's version differs from the R package's).
#'
#' @returns `multigpu_config()`: a list of class `multigpu_config` with
#'   `python` (the executable), `versions` (a named character vector:
#'   `python`, `numpy`, `tensorflow`, `keras`, `multigpu`, and `jax` on the
#'   JAX backend; `NA` for what is missing), `available` and `problem` (`NULL`, or the message).
#'   `is_multigpu_available()`: `TRUE` or `FALSE`.
#' @family multigpu environment
#' @export
#' @examples
#' is_multigpu_available()
#' multigpu_config()
multigpu_config <- function() {
  problem <- python_problem()
  running <- reticulate::py_available()
  structure(list(
    python = if (running) reticulate::py_exe(),
    versions = if (running) python_versions(),
    available = is.null(problem),
    problem = if (!is.null(problem)) as.character(problem)
  ), class = "multigpu_config")
}

#' @rdname multigpu_config
#' @export
is_multigpu_available <- function() {
  is.null(python_problem())
}

#' @export
print.multigpu_config <- function(x, ...) {
  cat("multigpu Python environment\n")
  cat(sprintf("  %-11s %s\n", c("python:", paste0(names(x$versions), ":")),
              c(x$python %||% "(not started)",
                ifelse(is.na(x$versions), "not installed", x$versions))), sep = "")
  if (x$available) cat("  status:     ready\n") else cat("\n", x$problem, "\n", sep = "")
  invisible(x)
}
