# How multigpu finds Python, and what the first call says when it cannot work.

fake_python <- function(dir) {
  path <- venv_python(dir)
  dir.create(dirname(path), recursive = TRUE, showWarnings = FALSE)
  file.create(path)
  normalizePath(path)
}

local_no_python_settings <- function(workon_home, env = parent.frame()) {
  withr::local_envvar(c(RETICULATE_PYTHON = NA, MULTIGPU_PYTHON = NA,
                        WORKON_HOME = workon_home), .local_envir = env)
  withr::local_options(multigpu.python = NULL, .local_envir = env)
}

test_that("find_python() applies the documented rules in order", {
  root <- withr::local_tempdir()
  workon <- file.path(root, "virtualenvs")
  project <- file.path(root, "project")
  wd <- file.path(project, "analysis", "deep")
  dir.create(wd, recursive = TRUE)
  local_no_python_settings(workon)

  # 6. Nothing configured: reticulate decides.
  choice <- find_python(wd)
  expect_null(choice$python)
  expect_identical(choice$source, "reticulate's default discovery")

  # 5. A .venv in the working directory or a parent.
  dotvenv <- fake_python(file.path(project, ".venv"))
  choice <- find_python(wd)
  expect_identical(normalizePath(choice$python), dotvenv)
  expect_identical(choice$source, paste("the .venv in", normalizePath(project)))

  # 4. The environment install_multigpu() creates wins over a .venv.
  installed <- fake_python(file.path(workon, "r-multigpu"))
  choice <- find_python(wd)
  expect_identical(normalizePath(choice$python), installed)
  expect_identical(choice$source, "the environment install_multigpu() created")

  # 3. MULTIGPU_PYTHON (an executable or an environment directory) ...
  other <- fake_python(file.path(root, "other-env"))
  withr::local_envvar(MULTIGPU_PYTHON = file.path(root, "other-env"))
  choice <- find_python(wd)
  expect_identical(normalizePath(choice$python), other)
  expect_identical(choice$source, "the MULTIGPU_PYTHON environment variable")
  # ... and the multigpu.python option, which comes first.
  withr::local_options(multigpu.python = other)
  expect_identical(find_python(wd)$source, "the R option multigpu.python")

  # 2. RETICULATE_PYTHON before everything.
  withr::local_envvar(RETICULATE_PYTHON = "/opt/python/bin/python3")
  choice <- find_python(wd)
  expect_identical(choice$python, "/opt/python/bin/python3")
  expect_identical(choice$source, "the RETICULATE_PYTHON environment variable")
})

test_that("default_env_dir() is under WORKON_HOME unless given a path", {
  withr::local_envvar(WORKON_HOME = "/srv/envs")
  expect_identical(default_env_dir(), file.path("/srv/envs", "r-multigpu"))
  expect_identical(default_env_dir("other"), file.path("/srv/envs", "other"))
  expect_identical(default_env_dir("~/envs/mg"), path.expand("~/envs/mg"))
})

test_that("core_python_range() reads the supported Pythons from the core's pyproject.toml", {
  supported <- core_python_range()
  expect_identical(supported$text, "3.10 to 3.13")
  pyproject <- withr::local_tempfile()
  writeLines(c("[project]", "requires-python = \">=3.11,<3.15\""), pyproject)
  expect_identical(core_python_range(pyproject),
                   list(min = numeric_version("3.11"), below = numeric_version("3.15"),
                        text = "3.11 to 3.14"))
})

test_that("diagnose() names each problem and its fix", {
  python <- file.path(R.home("bin"), "R")  # any existing file
  ok <- c(python = "3.11.7", numpy = "1.26.4", tensorflow = "2.21.0",
          keras = "3.15.1", multigpu = "0.1.0")
  source <- "the MULTIGPU_PYTHON environment variable"
  expect_null(diagnose(python, source, ok))
  with_version <- function(...) replace(ok, names(list(...)), c(...))
  expect_problem <- function(versions, ..., reticulate_version = "1.28") {
    problem <- diagnose(python, source, versions,
                        reticulate_version = package_version(reticulate_version))
    for (pattern in c(...)) expect_match(problem, pattern, fixed = TRUE)
  }

  expect_match(diagnose(NULL, "reticulate's default discovery", character()),
               "No Python was found for multigpu (chosen by reticulate's default discovery). Fix: run multigpu::install_multigpu()",
               fixed = TRUE)
  expect_match(diagnose("/no/such/python", source, character()),
               "The MULTIGPU_PYTHON environment variable points to /no/such/python, which does not exist. Fix:",
               fixed = TRUE)
  expect_problem("Traceback: boom", "could not be run: Traceback: boom")
  expect_problem(with_version(python = "3.9.18"),
                 "is version 3.9.18; multigpu needs Python 3.10 to 3.13")
  expect_problem(with_version(python = "3.14.0"), "is version 3.14.0")
  expect_problem(with_version(numpy = NA), "NumPy is not installed in the Python",
                 "install_multigpu()")
  expect_problem(with_version(numpy = "2.1.0"),
                 "NumPy 2.1.0 is installed in the Python",
                 "but reticulate 1.28 (the R-Python bridge of this R) only works with NumPy < 2",
                 "run multigpu::install_multigpu() (which installs NumPy < 2 for this reticulate)",
                 "upgrade reticulate to 1.38 or later")
  expect_null(diagnose(python, source, with_version(numpy = "2.1.0"),
                       reticulate_version = package_version("1.38.0")))
  expect_problem(with_version(tensorflow = NA),
                 "TensorFlow is not installed in the Python",
                 "(chosen by the MULTIGPU_PYTHON environment variable)")
  expect_problem(with_version(keras = "2.15.0"),
                 "multigpu needs Keras 3 but the Python", "has Keras 2.15.0")
  expect_problem(with_version(keras = NA), "has no Keras")
  expect_problem(with_version(multigpu = NA),
                 "The multigpu Python package is not installed in the Python")
  mismatch <- diagnose(python, source, with_version(multigpu = "0.0.9"),
                       r_package_version = "0.1.0")
  expect_s3_class(mismatch, "multigpu_version_mismatch")
  expect_match(mismatch, "has the multigpu Python package 0.0.9, but this R package is multigpu 0.1.0",
               fixed = TRUE)
})

test_that("probe_python() reads versions without importing, or returns the output of a failure", {
  skip_if_no_multigpu()
  versions <- probe_python(multigpu_config()$python)
  expect_named(versions, c("python", "numpy", "tensorflow", "keras", "multigpu"))
  expect_match(versions[["tensorflow"]], "^2\\.21\\.")
  expect_match(versions[["numpy"]], "^1\\.")
  broken <- tempfile()
  writeLines(c("#!/bin/sh", "echo 'cannot start' >&2", "exit 3"), broken)
  Sys.chmod(broken, "0755")
  expect_identical(probe_python(broken), "cannot start")
})

test_that("multigpu_config() reports the Python in use and is_multigpu_available() agrees", {
  skip_if_no_multigpu()
  config <- multigpu_config()
  expect_s3_class(config, "multigpu_config")
  expect_true(config$available)
  expect_null(config$problem)
  expect_true(is_multigpu_available())
  expect_true(file.exists(config$python))
  expect_identical(config$source, "the Python already running in this R session")
  output <- capture.output(print(config))
  expect_identical(output[[1]], "multigpu Python environment")
  expect_identical(output[[2]], sprintf("  executable: %s", config$python))
  expect_identical(output[[3]], sprintf("  chosen by:  %s", config$source))
  expect_true("  status:     ready" %in% output)
  expect_output(print(config), "tensorflow: 2.21", fixed = TRUE)
})

test_that("print.multigpu_config() shows the problem of an unusable Python", {
  config <- structure(
    list(python = "/x/bin/python", source = "the MULTIGPU_PYTHON environment variable",
         versions = c(python = "3.11.7", numpy = "1.26.4", tensorflow = NA,
                      keras = NA, multigpu = NA),
         available = FALSE, problem = "TensorFlow is not installed."),
    class = "multigpu_config")
  output <- capture.output(print(config))
  expect_true("  tensorflow: not installed" %in% output)
  expect_true("  numpy:      1.26.4" %in% output)
  expect_true("  status:     not usable" %in% output)
  expect_true("TensorFlow is not installed." %in% output)
})

# A virtual environment with fake packages (metadata, and a module that
# raises when imported): NumPy at `numpy_version`, and the packages in
# `...` (name = version), e.g. `tensorflow = "2.21.0"`. A fake multigpu
# module carries its version in its __version__ line.
fake_env <- function(numpy_version, ...) {
  skip_if_no_multigpu()
  dir <- withr::local_tempdir(.local_envir = parent.frame())
  status <- system2(multigpu_config()$python,
                    c("-m", "venv", "--without-pip", shQuote(dir)))
  expect_identical(status, 0L)
  site <- system2(venv_python(dir),
                  c("-c", shQuote("import sysconfig; print(sysconfig.get_paths()['purelib'])")),
                  stdout = TRUE)
  packages <- c(numpy = numpy_version, c(...))
  for (name in names(packages)) {
    version <- packages[[name]]
    dir.create(file.path(site, name))
    writeLines(c(sprintf("__version__ = \"%s\"", version),
                 sprintf("raise ImportError('a fake %s: never imported')", name)),
               file.path(site, name, "__init__.py"))
    meta <- file.path(site, sprintf("%s-%s.dist-info", name, version))
    dir.create(meta)
    writeLines(c("Metadata-Version: 2.1", paste("Name:", name),
                 paste("Version:", version)), file.path(meta, "METADATA"))
  }
  dir
}

first_call_code <- '
Sys.unsetenv("RETICULATE_PYTHON")
library(multigpu)
cat("loaded; python started:", reticulate::py_available(), "\\n")
error <- tryCatch(virtual_devices(2), error = identity)
cat("class:", class(error)[1], "\\n")
cat("message:", conditionMessage(error), "\\n")
'

test_that("with a missing Python, loading works and the first call says what is wrong", {
  output <- run_r(first_call_code, env = "MULTIGPU_PYTHON=/no/such/python3")
  expect_identical(attr(output, "status"), 0L)
  output <- paste(output, collapse = "\n")
  expect_match(output, "loaded; python started: FALSE", fixed = TRUE)
  expect_match(output, "class: multigpu_unavailable_error", fixed = TRUE)
  expect_match(output, "The MULTIGPU_PYTHON environment variable points to /no/such/python3, which does not exist. Fix: run multigpu::install_multigpu() and restart R",
               fixed = TRUE)
})

test_that("with a Python without TensorFlow, the first call says so", {
  env <- fake_env("1.26.4")
  output <- paste(run_r(first_call_code, env = paste0("MULTIGPU_PYTHON=", env)),
                  collapse = "\n")
  expect_match(output, "loaded; python started: FALSE", fixed = TRUE)
  expect_match(output, "class: multigpu_unavailable_error", fixed = TRUE)
  expect_match(output, sprintf("TensorFlow is not installed in the Python %s (chosen by the MULTIGPU_PYTHON environment variable)",
                               venv_python(env)), fixed = TRUE)
})

test_that("with NumPy 2 and reticulate < 1.38, the first call says so before Python starts", {
  skip_if(utils::packageVersion("reticulate") >= "1.38",
          "this reticulate works with NumPy 2")
  env <- fake_env("2.1.3")
  output <- paste(run_r(first_call_code, env = paste0("MULTIGPU_PYTHON=", env)),
                  collapse = "\n")
  expect_match(output, "class: multigpu_unavailable_error", fixed = TRUE)
  expect_match(output, sprintf("NumPy 2.1.3 is installed in the Python %s", venv_python(env)),
               fixed = TRUE)
  expect_match(output, sprintf("only works with NumPy < 2"), fixed = TRUE)
})

test_that("a multigpu Python package of another version is refused with a classed error", {
  env <- fake_env("1.26.4", tensorflow = "2.21.0", keras = "3.15.1",
                  multigpu = "0.0.9")
  output <- paste(run_r(first_call_code,
                        env = c(paste0("MULTIGPU_PYTHON=", env), "PYTHONPATH=")),
                  collapse = "\n")
  expect_match(output, "loaded; python started: FALSE", fixed = TRUE)
  expect_match(output, "class: multigpu_version_error", fixed = TRUE)
  expect_match(output, sprintf(
    "The Python %s (chosen by the MULTIGPU_PYTHON environment variable) has the multigpu Python package 0.0.9, but this R package is multigpu %s: the two must be the same version. Fix: run multigpu::install_multigpu()",
    venv_python(env), utils::packageVersion("multigpu")), fixed = TRUE)
})

test_that("the Python package this R package carries has the R package's version", {
  core <- bundled_core()
  expect_true(is_core_checkout(core))
  init <- readLines(file.path(core, "python", "multigpu", "__init__.py"))
  version <- sub('^__version__ = "(.*)"$', "\\1", grep("^__version__ = ", init, value = TRUE))
  expect_identical(version, as.character(utils::packageVersion("multigpu")))
})

test_that("Python subprocesses run without the library directories R put first", {
  r_lib <- R.home("lib")
  expect_identical(
    python_subprocess_env(paste(r_lib, "/usr/lib/x86_64-linux-gnu",
                                "/usr/lib/jvm/default-java/lib/server",
                                "/opt/cuda/lib64", "/lib", sep = ":")),
    paste0("LD_LIBRARY_PATH=", shQuote("/opt/cuda/lib64"))
  )
  expect_identical(python_subprocess_env(paste(r_lib, "/usr/lib", sep = ":")),
                   paste0("LD_LIBRARY_PATH=", shQuote("")))
  expect_identical(python_subprocess_env(""), character())
  skip_if_no_multigpu()
  # The Python in use reports the version it runs in-process (in R).
  expect_identical(probe_python(multigpu_config()$python)[["python"]],
                   reticulate::import("platform")$python_version())
})
