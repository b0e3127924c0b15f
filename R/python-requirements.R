# Zero set-up with reticulate >= 1.41: when nothing chose a Python, multigpu
# declares what it needs with reticulate::py_require() and reticulate
# resolves an environment through uv at the first call that needs Python,
# together with keras3's and tensorflow's declarations. Every version comes
# from the pyproject.toml the package carries (inst/python).

#' The requirements written in the core's pyproject.toml.
#'
#' A reader for the few fields used here (`requires-python`,
#' `dependencies` and the arrays of `[project.optional-dependencies]`), so
#' the versions are written once, in pyproject.toml.
#'
#' @returns A list: `python` (`">=3.10,<3.14"`), `dependencies` (a character
#'   vector) and `extras` (a named list of character vectors).
#' @noRd
core_requirements <- function(pyproject = file.path(bundled_core(), "pyproject.toml")) {
  # Each line without its comment (a # outside a quoted string).
  lines <- sub('^((?:[^"#]|"[^"]*")*)#.*$', "\\1",
               readLines(pyproject, warn = FALSE), perl = TRUE)
  strings <- function(text) {
    gsub('^"|"$', "", regmatches(text, gregexpr('"[^"]*"', text))[[1]])
  }
  unquoted <- function(text) gsub('"[^"]*"', "", text)
  count <- function(text, char) lengths(regmatches(text, gregexpr(char, text, fixed = TRUE)))
  fields <- list()
  section <- ""
  key <- NULL
  buffer <- ""
  for (line in lines) {
    if (is.null(key)) {
      if (!nzchar(trimws(line))) next
      if (grepl("^\\s*\\[", line)) {
        section <- gsub("^\\s*\\[+\\s*|\\s*\\]+\\s*$", "", line)
        next
      }
      found <- regmatches(line, regexec("^\\s*([A-Za-z0-9_.-]+)\\s*=\\s*(.*)$", line))[[1]]
      if (!length(found)) next
      key <- paste(section, found[[2]], sep = "/")
      buffer <- found[[3]]
    } else {
      buffer <- paste(buffer, line)
    }
    rest <- unquoted(buffer)
    if (count(rest, "[") <= count(rest, "]")) {
      fields[[key]] <- strings(buffer)
      key <- NULL
    }
  }
  extras <- fields[startsWith(names(fields), "project.optional-dependencies/")]
  names(extras) <- sub("^[^/]*/", "", names(extras))
  list(python = fields[["project/requires-python"]],
       dependencies = fields[["project/dependencies"]],
       extras = extras)
}

#' The values of the PEP 508 markers pyproject.toml uses, for this machine.
#' @noRd
marker_environment <- function(sysname = Sys.info()[["sysname"]],
                               machine = Sys.info()[["machine"]]) {
  platform <- switch(sysname, Linux = "linux", Darwin = "darwin",
                     Windows = "win32", tolower(sysname))
  # R spells Windows' 64-bit machine x86-64; Python's platform.machine()
  # says AMD64 there.
  if (platform == "win32" && machine %in% c("x86-64", "x86_64")) machine <- "AMD64"
  c(sys_platform = platform, platform_machine = machine)
}

#' Whether a requirement's marker (the text after `;`) holds here.
#'
#' Handles what pyproject.toml writes: `==` and `!=` on `sys_platform` and
#' `platform_machine`, `and`, `or`, `not` and parentheses; anything else is
#' an error rather than a guess.
#' @noRd
marker_holds <- function(marker, environment = marker_environment()) {
  marker <- trimws(marker)
  if (!nzchar(marker)) return(TRUE)
  comparison <- "([a-z_]+)\\s*(==|!=)\\s*'([^']*)'"
  found <- regmatches(marker, gregexpr(comparison, marker))[[1]]
  values <- vapply(found, function(text) {
    parts <- regmatches(text, regexec(comparison, text))[[1]]
    if (!parts[[2]] %in% names(environment)) {
      stop(sprintf("unsupported marker variable %s in '%s'", parts[[2]], marker))
    }
    same <- identical(unname(environment[[parts[[2]]]]), parts[[4]])
    if (parts[[3]] == "==") same else !same
  }, logical(1))
  expression <- marker
  for (i in seq_along(found)) {
    expression <- sub(found[[i]], if (values[[i]]) "TRUE" else "FALSE",
                      expression, fixed = TRUE)
  }
  expression <- gsub("\\band\\b", "&&", expression)
  expression <- gsub("\\bor\\b", "||", expression)
  expression <- gsub("\\bnot\\b", "!", expression)
  if (!grepl("^[TRUEFALS&|!() ]*$", expression)) {
    stop(sprintf("unsupported marker '%s'", marker))
  }
  isTRUE(eval(parse(text = expression), baseenv()))
}

#' The requirements of an extra that apply here, without their markers.
#' @noRd
applicable <- function(requirements, environment = marker_environment()) {
  holds <- vapply(requirements, function(requirement) {
    marker_holds(sub("^[^;]*;?", "", requirement), environment)
  }, logical(1))
  unname(trimws(sub(";.*$", "", requirements[holds])))
}

# The distributions that install the `tensorflow` module: two of them in one
# environment overwrite each other's files.
tensorflow_distributions <- c(
  "tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
  "tensorflow-macos", "tf-nightly", "tf-nightly-cpu", "tf-nightly-gpu"
)

#' The distribution a requirement names (lower case, no extras, version or
#' marker).
#' @noRd
requirement_name <- function(requirement) {
  tolower(trimws(sub("^\\s*([A-Za-z0-9_.-]+).*$", "\\1", requirement)))
}

#' Whether there is an NVIDIA GPU, as keras3 and tensorflow decide it for
#' their own declarations (Linux with nvidia-smi).
#' @noRd
has_nvidia_gpu <- function() {
  identical(Sys.info()[["sysname"]], "Linux") && nzchar(Sys.which("nvidia-smi"))
}

#' What multigpu asks of py_require(), given what is declared already.
#'
#' The core (a local path), its dependencies (Keras in the tested range,
#' NumPy) and the Python versions, from pyproject.toml. For TensorFlow, never
#' a second distribution: when keras3, tensorflow or the user declared one,
#' the version of the core's extras is added to that distribution (say
#' `tensorflow-cpu==2.21.*` beside keras3's `tensorflow-cpu`, or
#' `tensorflow[and-cuda]==2.21.*` beside its GPU build); when none is
#' declared, the core's own build for this platform (the `cpu` extra, or
#' `gpu` on Linux with an NVIDIA GPU). On a platform without a TensorFlow
#' 2.21 build (macOS on Intel), `problem` says so.
#'
#' @param declared The packages declared now (`py_require()$packages`)
#'   without multigpu's own.
#' @returns A list: `packages`, `python_version`, `problem` (`NULL` or a
#'   message).
#' @noRd
python_requirements <- function(declared = character(), core_path = NULL,
                                requirements = core_requirements(),
                                environment = marker_environment(),
                                gpu = has_nvidia_gpu()) {
  ours <- applicable(requirements$extras[[if (gpu) "gpu" else "cpu"]], environment)
  ours <- ours[requirement_name(ours) %in% tensorflow_distributions]
  problem <- NULL
  # pyproject.toml's darwin marker cannot exclude Intel Macs (TensorFlow
  # 2.21 has no wheel there, so pip and uv find nothing to install).
  intel_mac <- environment[["sys_platform"]] == "darwin" &&
    environment[["platform_machine"]] %in% c("x86_64", "i386")
  if (intel_mac) ours <- character()
  if (!length(ours)) {
    problem <- sprintf(paste(
      "TensorFlow 2.21 has no build for this platform (%s on %s): its last",
      "Intel-Mac release was 2.16, and multigpu needs 2.21. Use a Mac with",
      "Apple silicon, Linux or Windows."
    ), environment[["sys_platform"]], environment[["platform_machine"]])
  }
  # The version every TensorFlow distribution of the extras is pinned to.
  version <- sub("^[A-Za-z0-9_.-]+(\\[[^]]*\\])?\\s*", "", ours[1L])
  theirs <- declared[requirement_name(declared) %in% tensorflow_distributions]
  tensorflow <- if (is.null(problem) && !length(theirs)) {
    ours
  } else if (is.null(problem)) {
    # Pin each distinct distribution declared by the others, as they named
    # it (with its extras), unless it already carries a version.
    named <- unique(sub("^\\s*([A-Za-z0-9_.-]+(\\[[^]]*\\])?).*$", "\\1", theirs))
    pinned <- grepl("[=<>~!]", sub(";.*$", "", theirs))
    names_pinned <- unique(sub("^\\s*([A-Za-z0-9_.-]+(\\[[^]]*\\])?).*$", "\\1",
                               theirs[pinned]))
    targets <- setdiff(named, names_pinned)
    targets <- targets[requirement_name(targets) %in%
                         requirement_name(unlist(requirements$extras[c("cpu", "gpu")]))]
    if (length(targets)) paste0(targets, version) else character()
  }
  core <- if (!is.null(core_path)) {
    sprintf("multigpu @ %s", file_url(core_path))
  }
  list(packages = c(core, requirements$dependencies, tensorflow),
       python_version = requirements$python,
       problem = problem)
}

file_url <- function(path) {
  path <- normalizePath(path, winslash = "/", mustWork = FALSE)
  paste0(if (startsWith(path, "/")) "file://" else "file:///", path)
}

#' A copy of the bundled core in the user's cache, for uv to build.
#'
#' Building a source directory writes into it (setuptools' egg-info), and an
#' installed R package may be read-only; the directory's name carries a
#' digest of the files, so a changed core is a new path for uv's cache.
#' @noRd
cached_core <- function(source = bundled_core(),
                        cache = tools::R_user_dir("multigpu", "cache")) {
  files <- list.files(source, recursive = TRUE, all.files = FALSE)
  files <- files[!grepl("__pycache__|\\.egg-info|\\.pyc$", files)]
  files <- sort(files[startsWith(files, "python/multigpu/") |
                        files %in% c("pyproject.toml", "README.md")])
  digest <- tools::md5sum(file.path(source, files))
  listing <- tempfile("multigpu-core-files-")
  writeLines(paste(files, digest), listing)
  key <- substr(unname(tools::md5sum(listing)), 1L, 12L)
  unlink(listing)
  version <- as.character(utils::packageVersion("multigpu"))
  target <- file.path(cache, sprintf("core-%s-%s", version, key), "multigpu")
  if (!file.exists(file.path(target, "pyproject.toml"))) {
    dir.create(dirname(target), recursive = TRUE, showWarnings = FALSE)
    copy <- copy_core_source(source)
    on.exit(unlink(dirname(copy), recursive = TRUE), add = TRUE)
    if (!file.rename(copy, target)) {
      dir.create(target, showWarnings = FALSE)
      file.copy(list.files(copy, full.names = TRUE), target, recursive = TRUE)
    }
  }
  target
}


#' Declare multigpu's requirements with py_require() when reticulate
#' provisions the Python (see ?multigpu_config); called by .onLoad after
#' select_python().
#'
#' keras3 (and tensorflow, with PY_REQUIRE_TENSORFLOW) declare their
#' TensorFlow in their .onLoad; when they load after multigpu, the
#' declarations are looked at again right after theirs (packageEvent hooks
#' run after a package's .onLoad), and once more just before multigpu's
#' first call starts Python.
#' @noRd
declare_python_requirements <- function() {
  if (!isTRUE(.globals$choice$managed) ||
      reticulate::py_available(initialize = FALSE)) {
    return(invisible(FALSE))
  }
  update_python_requirements()
  for (package in c("keras3", "tensorflow")) {
    if (!isNamespaceLoaded(package)) {
      setHook(packageEvent(package, "onLoad"),
              function(...) update_python_requirements())
    }
  }
  invisible(TRUE)
}

#' Bring multigpu's py_require() declarations up to date with the others'.
#' @noRd
update_python_requirements <- function() {
  if (!isTRUE(.globals$choice$managed) ||
      reticulate::py_available(initialize = FALSE)) {
    return(invisible())
  }
  py_require <- getExportedValue("reticulate", "py_require")
  previous <- .globals$declared
  if (length(previous)) py_require(previous, action = "remove")
  declared <- declared_packages()
  core_path <- cached_core()
  wanted <- python_requirements(declared, core_path)
  new <- setdiff(wanted$packages, declared)
  if (length(new)) py_require(new)
  if (!isTRUE(.globals$declared_python) && length(wanted$python_version)) {
    py_require(python_version = wanted$python_version)
    .globals$declared_python <- TRUE
  }
  .globals$declared <- new
  .globals$requirements_problem <- wanted$problem
  invisible(new)
}

#' Every package declared with py_require() in this session.
#' @noRd
declared_packages <- function() {
  if (utils::packageVersion("reticulate") < "1.41") return(character())
  # Called through getExportedValue: reticulate < 1.41 has no py_require().
  getExportedValue("reticulate", "py_require")()$packages
}

#' Where uv is, looked up as reticulate does, or NULL.
#' @noRd
find_uv <- function() {
  candidates <- c(
    Sys.getenv("RETICULATE_UV"),
    as.character(getOption("reticulate.uv_binary", "")),
    Sys.which("uv"),
    path.expand("~/.local/bin/uv"),
    file.path(tools::R_user_dir("reticulate", "cache"), "uv", "bin",
              if (.Platform$OS.type == "windows") "uv.exe" else "uv")
  )
  candidates <- candidates[nzchar(candidates) & candidates != "managed"]
  found <- candidates[file.exists(candidates)]
  if (length(found)) found[[1]] else NULL
}

#' Have reticulate create (or reuse) the py_require() environment and start
#' Python in it; the problem, as a message, when it cannot.
#' @noRd
provision_python <- function() {
  update_python_requirements()
  if (!is.null(.globals$requirements_problem)) {
    return(.globals$requirements_problem)
  }
  # reticulate reports uv's failures through try(), on try.outFile.
  output <- character()
  connection <- textConnection("output", "w", local = TRUE)
  old <- options(try.outFile = connection)
  error <- tryCatch({
    reticulate::py_config()
    NULL
  }, error = function(e) conditionMessage(e))
  options(old)
  close(connection)
  if (is.null(error)) return(NULL)
  # reticulate's first report is the cause; its final error may only be a
  # consequence.
  provision_problem(paste(c(output, error), collapse = "\n"))
}

#' The message for a py_require() environment reticulate could not create.
#' @noRd
provision_problem <- function(details, uv = find_uv(),
                              python_range = core_python_range()$text,
                              requested = declared_packages()) {
  requested <- paste(requested, collapse = ", ")
  start <- sprintf(paste(
    "multigpu asked reticulate for a Python environment with",
    "py_require() (nothing else chose a Python: see ?multigpu_config),",
    "and reticulate could not create it:"
  ))
  without_uv <- paste(
    "or, without uv, run multigpu::install_multigpu() and restart R (it",
    "creates the r-multigpu environment with pip, which multigpu then",
    "finds by itself)."
  )
  if (is.null(uv)) {
    return(structure(paste(
      start, "it needs uv, which is not installed (not on the PATH, nor",
      "RETICULATE_UV, ~/.local/bin/uv or reticulate's cache), and",
      "reticulate could not download it from https://astral.sh/uv.",
      "Fix: install uv (`pip install uv`, or see",
      "https://docs.astral.sh/uv/getting-started/installation/) so that it",
      "is on the PATH, or set Sys.setenv(RETICULATE_UV = \"/path/to/uv\"),",
      "then restart R;", without_uv
    ), reason = "uv"))
  }
  if (grepl("Python version constraints could not be satisfied", details,
            fixed = TRUE)) {
    available <- sub(".*Available Python versions found: *([^\n]*).*", "\\1",
                     details)
    return(structure(sprintf(paste(
      "%s uv (%s) found no Python %s, which TensorFlow 2.21 needs%s, and",
      "could not download one%s. Fix: install Python 3.11 (or another of",
      "%s), or let uv download one (unset UV_PYTHON_DOWNLOADS), then",
      "restart R; or run multigpu::install_multigpu(python =",
      "\"/path/to/python3.11\") and restart R."
    ), start, uv, python_range,
    if (!identical(available, details)) paste0(" (it found: ", available, ")") else "",
    if (tolower(Sys.getenv("UV_PYTHON_DOWNLOADS")) %in% c("never", "manual"))
      " (UV_PYTHON_DOWNLOADS is never)" else "",
    python_range), reason = "python"))
  }
  structure(sprintf(paste(
    "%s uv (%s) could not install the requirements of this session (%s);",
    "its output above names the package. The usual cause is a package",
    "without a build (a wheel) for this platform or Python, or a",
    "requirement of your own that conflicts. Fix: see",
    "reticulate::py_require() for who asked what, remove or change the",
    "conflicting requirement and restart R;", without_uv,
    "\nreticulate said: %s"
  ), start, uv, requested, first_error(details)), reason = "resolution")
}

# The first error line reticulate reported, or the whole text.
first_error <- function(details) {
  lines <- trimws(strsplit(details, "\n", fixed = TRUE)[[1]])
  lines <- lines[nzchar(lines)]
  errors <- grep("^Error", lines)
  if (!length(errors)) return(paste(lines, collapse = " "))
  paste(lines[errors[[1]]:min(errors[[1]] + 1L, length(lines))], collapse = " ")
}
