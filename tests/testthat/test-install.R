test_that("install_requirements() asks for the core with the extras that hold every version requirement", {
  core <- withr::local_tempdir()
  writeLines(c("[project]", "name = \"multigpu\""), file.path(core, "pyproject.toml"))
  expect_identical(install_requirements(core, reticulate_version = package_version("1.28")),
                   sprintf("%s[cpu,demo,numpy1]", normalizePath(core)))
  expect_identical(
    install_requirements(core, gpu = TRUE, demo = FALSE,
                         extra_packages = c("pandas", "rich"),
                         reticulate_version = package_version("1.38")),
    c(sprintf("%s[gpu]", normalizePath(core)), "pandas", "rich")
  )
  expect_identical(
    install_requirements("multigpu @ file:///wheels/multigpu-0.1.0-py3-none-any.whl",
                         demo = FALSE, reticulate_version = package_version("1.38")),
    "multigpu[cpu] @ file:///wheels/multigpu-0.1.0-py3-none-any.whl"
  )
})

test_that("the extras install_multigpu() asks for exist in the core's pyproject.toml", {
  pyproject <- readLines(file.path(bundled_core(), "pyproject.toml"))
  for (extra in c("cpu", "gpu", "demo", "numpy1")) {
    expect_true(any(grepl(sprintf("^%s = \\[", extra), pyproject)), label = extra)
  }
})

test_that("find_core_source() uses `core`, then MULTIGPU_CORE, then the core this R package carries", {
  root <- withr::local_tempdir()
  checkout <- file.path(root, "multigpu")
  dir.create(file.path(checkout, "vignettes"), recursive = TRUE)
  writeLines(c("[project]", "name = \"multigpu\"", "version = \"0.1.0\""),
             file.path(checkout, "pyproject.toml"))
  withr::local_envvar(MULTIGPU_CORE = NA)
  expect_identical(find_core_source(checkout), checkout)
  expect_identical(find_core_source("multigpu @ git+https://example.org/multigpu"),
                   "multigpu @ git+https://example.org/multigpu")
  # From any working directory, without a checkout: the bundled core.
  withr::with_dir(root, expect_identical(find_core_source(), bundled_core()))
  expect_true(file.exists(file.path(find_core_source(), "python", "multigpu", "__init__.py")))
  expect_error(find_core_source(root),
               "`core` is a directory without the multigpu pyproject.toml", class = "multigpu_value_error")
  expect_error(find_core_source(file.path(root, "nowhere")), "`core` does not exist",
               class = "multigpu_value_error")
  expect_error(find_core_source(NA_character_), "`core` must be a single non-empty path",
               class = "multigpu_value_error")
  withr::local_envvar(MULTIGPU_CORE = checkout)
  expect_identical(find_core_source(), checkout)
})

test_that("copy_core_source() copies what pip needs and leaves caches behind", {
  copy <- copy_core_source(bundled_core())
  withr::defer(unlink(dirname(copy), recursive = TRUE))
  expect_true(is_core_checkout(copy))
  expect_true(file.exists(file.path(copy, "python", "multigpu", "replicas.py")))
  expect_length(list.files(copy, "^__pycache__$", recursive = TRUE, include.dirs = TRUE), 0L)
})

test_that("install_multigpu() stops on an Intel Mac, where TensorFlow 2.21 has no build", {
  expect_error(check_platform_has_tensorflow("Darwin", "x86_64"),
               "TensorFlow 2.21 has no build for macOS on Intel (x86_64)",
               fixed = TRUE, class = "multigpu_install_error")
  expect_true(check_platform_has_tensorflow("Darwin", "arm64"))
  expect_true(check_platform_has_tensorflow("Linux", "x86_64"))
  expect_true(check_platform_has_tensorflow("Windows", "x86-64"))
})

test_that("base_python() checks the Python that creates the environment", {
  expect_error(base_python("/no/such/python3"), "/no/such/python3 does not exist",
               class = "multigpu_install_error")
  old <- tempfile()
  writeLines(c("#!/bin/sh", "echo python=3.8.10; echo numpy=; echo tensorflow=; echo keras=; echo multigpu="), old)
  Sys.chmod(old, "0755")
  expect_error(base_python(old), "is version 3.8.10; TensorFlow 2.21 needs Python 3.10 to 3.13",
               class = "multigpu_install_error")
  skip_if_no_multigpu()
  base <- base_python(multigpu_config()$python)
  expect_match(base$version, "^3\\.1[0-3]\\.")
})

test_that("install_multigpu() rejects bad arguments before doing anything", {
  expect_error(install_multigpu(envname = NA_character_), "`envname` must be a single string",
               class = "multigpu_value_error")
  expect_error(install_multigpu(core = file.path(tempdir(), "nowhere")), "`core` does not exist",
               class = "multigpu_value_error")
  expect_error(install_multigpu(gpu = NA, core = "multigpu @ file:///x"),
               "`gpu` must be TRUE or FALSE, not NA", class = "multigpu_value_error")
})

test_that("install_multigpu() creates an environment, updates it, and says what it did", {
  skip_if_no_multigpu()
  core <- find_core_source()
  python <- multigpu_config()$python
  env <- file.path(withr::local_tempdir(), "r-multigpu-test")
  # TensorFlow and friends come from the Python in use (on PYTHONPATH),
  # so pip finds them installed instead of downloading them again; the
  # multigpu core itself is really installed into the new environment.
  site <- dirname(dirname(reticulate::import("numpy")$`__file__`))
  withr::local_envvar(PYTHONPATH = site, PIP_DISABLE_PIP_VERSION_CHECK = "1")

  messages <- character()
  collect <- function(m) {
    messages <<- c(messages, sub("\n$", "", conditionMessage(m)))
    invokeRestart("muffleMessage")
  }
  result <- withCallingHandlers(
    install_multigpu(env, core = core, python = python, demo = FALSE, quiet = TRUE),
    message = collect
  )
  expect_true(result$created)
  expect_identical(result$python, venv_python(env))
  expect_true(file.exists(result$python))
  expect_match(messages[[1]], sprintf("^Creating the virtual environment %s with Python 3\\.", env))
  expect_match(messages[[2]], "^Installing: /.*/multigpu\\[cpu(,numpy1)?\\]$")
  # NumPy 1 only for a reticulate that cannot use NumPy 2 (< 1.38).
  numpy <- if (utils::packageVersion("reticulate") < "1.38") "1" else "2"
  expect_match(messages[[3]], sprintf("Done: %s now has Python 3.*, TensorFlow 2\\.21\\..*, Keras 3\\.15\\..*, NumPy %s\\..* and multigpu 0\\.1\\.0\\.", env, numpy))
  expect_match(messages[[4]], sprintf("MULTIGPU_PYTHON = \"%s\"", result$python), fixed = TRUE)
  expect_match(messages[[4]], "Python is already running in this R session: restart R first.", fixed = TRUE)

  # The core is installed in the environment itself, not borrowed.
  withr::local_envvar(PYTHONPATH = NA)
  own <- probe_python(result$python)
  expect_identical(own[["multigpu"]], "0.1.0")
  withr::local_envvar(PYTHONPATH = site)

  messages <- character()
  result <- withCallingHandlers(
    install_multigpu(env, core = core, demo = FALSE, quiet = TRUE),
    message = collect
  )
  expect_false(result$created)
  expect_identical(messages[[1]], sprintf("Updating the virtual environment %s", env))
  expect_identical(result$versions[["numpy"]], probe_python(python)[["numpy"]])
})

test_that("install_multigpu() reports a failing pip as an install error", {
  skip_if_no_multigpu()
  env <- file.path(withr::local_tempdir(), "env")
  dir.create(dirname(venv_python(env)), recursive = TRUE)
  failing <- venv_python(env)
  writeLines(c("#!/bin/sh", "echo 'pip: no network' >&2", "exit 1"), failing)
  Sys.chmod(failing, "0755")
  expect_error(
    suppressMessages(install_multigpu(env, core = "multigpu @ file:///nowhere.whl", quiet = TRUE)),
    "Could not install the packages: `.*env/bin/python -m pip install --quiet multigpu\\[cpu,demo(,numpy1)?\\] @ file:///nowhere.whl` exited with status 1",
    class = "multigpu_install_error"
  )
})

test_that("the Python package this R package carries has the R package's version", {
  core <- bundled_core()
  expect_true(is_core_checkout(core))
  init <- readLines(file.path(core, "python", "multigpu", "__init__.py"))
  version <- sub('^__version__ = "(.*)"$', "\\1", grep("^__version__ = ", init, value = TRUE))
  expect_identical(version, as.character(utils::packageVersion("multigpu")))
})
