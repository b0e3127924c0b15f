# What multigpu_config() reports, and what the first call says when the
# Python cannot work (python-config.R, and core() in bridge.R).

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

test_that("NumPy 2 is refused before Python starts only with reticulate < 1.38", {
  env <- fake_env("2.1.3")
  output <- paste(run_r(first_call_code, env = paste0("MULTIGPU_PYTHON=", env)),
                  collapse = "\n")
  expect_match(output, "class: multigpu_unavailable_error", fixed = TRUE)
  numpy_refused <- sprintf("NumPy 2.1.3 is installed in the Python %s", venv_python(env))
  if (utils::packageVersion("reticulate") < "1.38") {
    expect_match(output, numpy_refused, fixed = TRUE)
    expect_match(output, "only works with NumPy < 2", fixed = TRUE)
  } else {
    # This reticulate works with NumPy 2: what is missing is TensorFlow.
    expect_no_match(output, numpy_refused, fixed = TRUE)
    expect_match(output, "TensorFlow is not installed", fixed = TRUE)
  }
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
