# Checking a Python for multigpu: the versions of what it needs, read in a
# subprocess (so Python need not start in R), and what is wrong with them.

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

# The fix when reticulate made the environment from multigpu's py_require()
# declarations: the declarations come from this package, so a wrong
# environment is a stale one.
managed_fix_text <- paste(
  "Fix: restart R, and reticulate builds the environment again from what",
  "this multigpu package declares with py_require(); if that does not help,",
  "clear reticulate's cache with",
  "unlink(tools::R_user_dir(\"reticulate\", \"cache\"), recursive = TRUE)",
  "and restart R, or run multigpu::install_multigpu() and restart R."
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

#' Whether `version` (such as `"3.11.7"`, or `NA`) is a Python the core
#' supports.
#' @noRd
is_supported_python <- function(version, supported = core_python_range()) {
  version <- numeric_version(version, strict = FALSE)
  !is.na(version) && version >= supported$min && version < supported$below
}

#' What is wrong with a Python for multigpu, or NULL when nothing is.
#'
#' @param versions The result of `probe_python()`.
#' @noRd
diagnose <- function(python, source, versions,
                     reticulate_version = utils::packageVersion("reticulate"),
                     r_package_version = as.character(utils::packageVersion("multigpu")),
                     fix = fix_text) {
  where <- sprintf("(chosen by %s)", source)
  if (is.null(python) || !nzchar(python)) {
    return(sprintf("No Python was found for multigpu %s. %s", where,
                   fix))
  }
  if (!file.exists(python)) {
    return(sprintf("%s points to %s, which does not exist. %s",
                   capitalise(source), python, fix))
  }
  if (is.character(versions) && is.null(names(versions))) {
    return(sprintf("The Python %s %s could not be run: %s\n%s",
                   python, where, versions, fix))
  }
  if (!is_supported_python(versions[["python"]])) {
    return(sprintf(
      "The Python %s %s is version %s; multigpu needs Python %s (TensorFlow 2.21 supports no other). %s",
      python, where, versions[["python"]], core_python_range()$text, fix
    ))
  }
  numpy <- versions[["numpy"]]
  if (is.na(numpy)) {
    return(sprintf("NumPy is not installed in the Python %s %s. %s",
                   python, where, fix))
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
                   python, where, fix))
  }
  keras <- numeric_version(versions[["keras"]], strict = FALSE)
  if (is.na(versions[["keras"]]) || (!is.na(keras) && keras < "3")) {
    return(sprintf(
      "multigpu needs Keras 3 but the Python %s %s has %s. %s",
      python, where,
      if (is.na(versions[["keras"]])) "no Keras" else
        paste("Keras", versions[["keras"]]),
      fix
    ))
  }
  if (is.na(versions[["multigpu"]])) {
    return(sprintf(
      "The multigpu Python package is not installed in the Python %s %s. %s",
      python, where, fix
    ))
  }
  if (!identical(versions[["multigpu"]], r_package_version)) {
    return(structure(sprintf(paste(
      "The Python %s %s has the multigpu Python package %s, but this R",
      "package is multigpu %s: the two must be the same version. %s"
    ), python, where, versions[["multigpu"]], r_package_version,
    if (identical(fix, fix_text)) paste(
      "Fix: run multigpu::install_multigpu() (it installs the Python",
      "package this R package carries) and restart R."
    ) else fix),
    class = "multigpu_version_mismatch"))
  }
  NULL
}

capitalise <- function(text) {
  paste0(toupper(substr(text, 1L, 1L)), substring(text, 2L))
}
