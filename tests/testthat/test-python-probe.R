# Checking a Python for multigpu without starting it (python-probe.R).

test_that("core_python_range() reads the supported Pythons from the core's pyproject.toml", {
  supported <- core_python_range()
  expect_identical(supported$text, "3.10 to 3.13")
  pyproject <- withr::local_tempfile()
  writeLines(c("[project]", "requires-python = \">=3.11,<3.15\""), pyproject)
  expect_identical(core_python_range(pyproject),
                   list(min = numeric_version("3.11"), below = numeric_version("3.15"),
                        text = "3.11 to 3.14"))
})

test_that("is_supported_python() accepts the core's Python versions only", {
  expect_true(is_supported_python("3.10.0"))
  expect_true(is_supported_python("3.13.5"))
  expect_false(is_supported_python("3.9.18"))
  expect_false(is_supported_python("3.14.0"))
  expect_false(is_supported_python(NA_character_))
  expect_false(is_supported_python("unknown"))
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
  # The tests' Python has NumPy 2 wherever reticulate can use it (>= 1.38).
  numpy <- if (utils::packageVersion("reticulate") < "1.38") "^1\\." else "^2\\."
  expect_match(versions[["numpy"]], numpy)
  broken <- tempfile()
  writeLines(c("#!/bin/sh", "echo 'cannot start' >&2", "exit 3"), broken)
  Sys.chmod(broken, "0755")
  expect_identical(probe_python(broken), "cannot start")
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
