test_that("loading multigpu declares the core, the Python versions and the constraints, without starting Python", {
  skip_if_no_multigpu()
  output <- run_r('
    Sys.setenv(UV_CONSTRAINT = "/elsewhere/theirs.txt")
    library(multigpu)
    cat("started:", reticulate::py_available(), "\\n")
    declared <- reticulate::py_require()
    cat("packages:", declared$packages, "\\n")
    cat("python:", paste(declared$python_version, collapse = ","), "\\n")
    cat("constraints:", Sys.getenv("UV_CONSTRAINT"), "\\n")
  ', env = "RETICULATE_PYTHON=")
  output <- paste(output, collapse = "\n")
  expect_match(output, "started: FALSE", fixed = TRUE)
  expect_match(output, "packages:.* multigpu @ file:///")
  expect_match(output, "python: >=3.10,<3.14", fixed = TRUE)
  expect_match(output, "constraints: /elsewhere/theirs.txt /.*/python/constraints.txt")
  # keras3 (loaded first, as an import) declared TensorFlow's distribution;
  # multigpu named none.
  expect_match(output, "packages:.*tensorflow")
})

test_that("on the JAX backend the core is declared with its jax extra, following keras3::use_backend() until Python starts", {
  skip_if_no_multigpu()
  output <- run_r('
    show <- function(when) {
      packages <- reticulate::py_require()$packages
      cat(when, paste(packages[grepl("^(multigpu|jax)", packages)], collapse = " | "), "\\n")
    }
    library(multigpu)
    show("loaded:")
    keras3::use_backend("tensorflow")
    multigpu:::declare_python_requirements()
    show("tensorflow:")
    keras3::use_backend("jax")
    multigpu:::declare_python_requirements()
    show("jax again:")
    cat("started:", reticulate::py_available(), "\\n")
  ', env = c("RETICULATE_PYTHON=", "KERAS_BACKEND=jax"))
  output <- paste(output, collapse = "\n")
  # Loaded with KERAS_BACKEND=jax: keras3 declared its JAX build, multigpu
  # the core with the jax extra (the tested range is pyproject.toml's).
  expect_match(output, "loaded: [^\n]*multigpu\\[jax\\] @ file:///")
  expect_match(output, "loaded: [^\n]*jax\\[cpu\\]")
  # Another backend chosen before Python starts: the plain core, alone.
  expect_match(output, "tensorflow: multigpu @ file:///[^|]*\n")
  expect_match(output, "jax again: [^\n]*multigpu\\[jax\\] @ file:///")
  expect_no_match(output, "jax again: [^\n]*multigpu @ file")
  expect_match(output, "started: FALSE", fixed = TRUE)
})

test_that("MULTIGPU_PYTHON is forwarded to RETICULATE_PYTHON", {
  output <- run_r('library(multigpu); cat("chosen:", Sys.getenv("RETICULATE_PYTHON"), "\\n")',
                  env = c("RETICULATE_PYTHON=", "MULTIGPU_PYTHON=/opt/python/bin/python3"))
  expect_match(paste(output, collapse = "\n"), "chosen: /opt/python/bin/python3", fixed = TRUE)
})

test_that("the core requirement points at a cached copy of the core this package carries", {
  cache <- withr::local_tempdir()
  copy <- cached_core(cache)
  expect_true(startsWith(copy, cache))
  expect_true(file.exists(file.path(copy, "pyproject.toml")))
  expect_true(file.exists(file.path(copy, "python", "multigpu", "engines", "tensorflow", "replicate.py")))
  expect_length(list.files(copy, "^__pycache__$", recursive = TRUE, include.dirs = TRUE), 0L)
  init <- readLines(file.path(copy, "python", "multigpu", "__init__.py"))
  expect_true(any(sprintf('__version__ = "%s"', utils::packageVersion("multigpu")) == init))
  # The same files give the same path (uv's cache keeps its build).
  expect_identical(cached_core(cache), copy)
  expect_match(core_requirement(), "^multigpu @ file:///")
  expect_match(core_requirement(c("cpu", "demo")), "^multigpu\\[cpu,demo\\] @ file:///")
})

test_that("each failure to start Python names its fix", {
  no_uv <- start_problem("uv not found", uv = FALSE,
                         machine = c(sysname = "Linux", machine = "x86_64"))
  expect_match(no_uv, "with uv, which is not installed")
  expect_match(no_uv, "pip install uv", fixed = TRUE)
  expect_match(no_uv, "install_multigpu()", fixed = TRUE)
  python <- start_problem("No interpreter found for Python >=3.10, <3.14", uv = TRUE,
                          machine = c(sysname = "Linux", machine = "x86_64"))
  expect_match(python, "found no Python >=3.10,<3.14", fixed = TRUE)
  expect_match(python, "unset UV_PYTHON_DOWNLOADS", fixed = TRUE)
  intel_mac <- start_problem("no wheel", uv = TRUE,
                             machine = c(sysname = "Darwin", machine = "x86_64"))
  expect_match(intel_mac, "TensorFlow 2.21 has no build for macOS on Intel", fixed = TRUE)
  other <- start_problem("conflict", uv = TRUE,
                         machine = c(sysname = "Linux", machine = "x86_64"))
  expect_match(other, "reticulate::py_require()", fixed = TRUE)
})

test_that("an unsupported Python, TensorFlow or core version names its fix", {
  good <- c(python = "3.11.7", numpy = "2.4.0", tensorflow = "2.21.0",
            keras = "3.15.1", multigpu = "0.1.0")
  check <- function(...) {
    versions <- good
    changes <- c(...)
    versions[names(changes)] <- changes
    versions_problem(versions, "/env/bin/python", package = "0.1.0")
  }
  expect_null(check())
  expect_match(check(python = "3.9.18"), "is Python 3.9.18; multigpu needs Python >=3.10,<3.14")
  expect_match(check(tensorflow = "2.16.1"), "has TensorFlow 2.16.1; multigpu needs TensorFlow 2.21")
  expect_match(check(tensorflow = NA), "has no tensorflow package")
  expect_match(check(multigpu = NA), "has no multigpu package. Fix: .*install_multigpu()")
  # On the JAX backend the versions have jax, and TensorFlow is optional.
  expect_null(check(jax = "0.10.2"))
  expect_null(check(jax = "0.10.2", tensorflow = NA))
  expect_match(check(jax = "0.10.2", tensorflow = "2.16.1"), "has TensorFlow 2.16.1")
  expect_match(check(jax = NA), 'has no jax package, which the JAX backend (keras3::use_backend("jax")) needs. Fix:',
               fixed = TRUE)
  mismatch <- check(multigpu = "0.0.9")
  expect_s3_class(mismatch, "multigpu_version_mismatch")
  expect_match(mismatch, "multigpu Python package 0.0.9, but this R package is multigpu 0.1.0")
})

test_that("multigpu_config() reports the running Python and its versions", {
  skip_if_no_multigpu()
  config <- multigpu_config()
  expect_s3_class(config, "multigpu_config")
  expect_true(config$available)
  expect_null(config$problem)
  expect_identical(config$versions[["multigpu"]], as.character(utils::packageVersion("multigpu")))
  expect_match(config$versions[["tensorflow"]], "^2\\.21\\.")
  expect_output(print(config), "status:     ready")
})

test_that("starting Python hides only reticulate's recovered C stack overflow", {
  # What reticulate 1.46's try() prints when its search for a Python recurses
  # until R's C stack limit (R/python.R), beside a line that must stay.
  start <- function() {
    try(stop(simpleError("C stack usage  7971092 is too close to the limit")))
    try(stop(simpleError("a real problem")))
    "started"
  }
  printed <- capture.output(result <- start_python(start), type = "message")
  expect_identical(result, "started")
  expect_identical(printed, "Error : a real problem")
  expect_true(is_recovered_stack_overflow(
    "Error : C stack usage  7971092 is too close to the limit"))
  expect_false(is_recovered_stack_overflow("Error in f() : C stack usage  7971092 is wrong"))
})
