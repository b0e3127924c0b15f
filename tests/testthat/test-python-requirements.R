# What multigpu declares with py_require() (python-requirements.R). The
# environment reticulate then creates with uv is tested end to end by
# .ci/r-zero-setup-test.sh.

pyproject <- function() {
  path <- file.path(bundled_core(), "pyproject.toml")
  if (!file.exists(path)) path <- testthat::test_path("..", "..", "pyproject.toml")
  path
}

linux <- c(sys_platform = "linux", platform_machine = "x86_64")
linux_arm <- c(sys_platform = "linux", platform_machine = "aarch64")
apple_silicon <- c(sys_platform = "darwin", platform_machine = "arm64")
intel_mac <- c(sys_platform = "darwin", platform_machine = "x86_64")
windows <- c(sys_platform = "win32", platform_machine = "AMD64")

test_that("core_requirements() reads pyproject.toml's requirements", {
  requirements <- core_requirements(pyproject())
  expect_identical(requirements$python, ">=3.10,<3.14")
  expect_true(any(startsWith(requirements$dependencies, "keras>=3.15")))
  expect_identical(requirements$extras$gpu, "tensorflow[and-cuda]==2.21.*")
  expect_length(requirements$extras$cpu, 2L)
  expect_match(requirements$extras$cpu[[1]], "^tensorflow-cpu==2\\.21\\.\\*; ")
})

test_that("the cpu extra's markers pick one TensorFlow build per platform", {
  cpu <- core_requirements(pyproject())$extras$cpu
  expect_identical(applicable(cpu, linux), "tensorflow-cpu==2.21.*")
  expect_identical(applicable(cpu, windows), "tensorflow-cpu==2.21.*")
  expect_identical(applicable(cpu, linux_arm), "tensorflow==2.21.*")
  expect_identical(applicable(cpu, apple_silicon), "tensorflow==2.21.*")
  # pyproject.toml's darwin marker covers Intel Macs too; the R side knows
  # TensorFlow 2.21 has no wheel there (next test).
  expect_identical(applicable(cpu, intel_mac), "tensorflow==2.21.*")
  expect_identical(marker_environment("Windows", "x86-64")[["platform_machine"]], "AMD64")
  expect_error(marker_holds("python_version >= '3.10'", linux), "unsupported")
})

test_that("alone, multigpu declares its core, Keras and its TensorFlow build", {
  wanted <- python_requirements(character(), core_path = "/opt/core/multigpu",
                                requirements = core_requirements(pyproject()),
                                environment = linux, gpu = FALSE)
  expect_null(wanted$problem)
  expect_identical(wanted$packages[[1]], "multigpu @ file:///opt/core/multigpu")
  expect_true("keras>=3.15,<3.16" %in% wanted$packages)
  expect_true("tensorflow-cpu==2.21.*" %in% wanted$packages)
  expect_identical(wanted$python_version, ">=3.10,<3.14")
  gpu <- python_requirements(character(), requirements = core_requirements(pyproject()),
                             environment = linux, gpu = TRUE)
  expect_true("tensorflow[and-cuda]==2.21.*" %in% gpu$packages)
  expect_false(any(grepl("tensorflow-cpu", gpu$packages)))
})

test_that("beside keras3's TensorFlow, only the version is added to that distribution", {
  requirements <- core_requirements(pyproject())
  tf_of <- function(declared, environment = linux) {
    packages <- python_requirements(declared, requirements = requirements,
                                    environment = environment, gpu = FALSE)$packages
    packages[requirement_name(packages) %in% tensorflow_distributions]
  }
  keras3 <- c("numpy", "keras", "pydot", "scipy")
  # keras3 on Linux without a GPU, with one, and on macOS.
  expect_identical(tf_of(c(keras3, "tensorflow-cpu")), "tensorflow-cpu==2.21.*")
  expect_identical(tf_of(c(keras3, "tensorflow[and-cuda]")), "tensorflow[and-cuda]==2.21.*")
  expect_identical(tf_of(c(keras3, "tensorflow", "tensorflow-metal"), apple_silicon),
                   "tensorflow==2.21.*")
  # A version someone gave stands; a distribution the core never names is left alone.
  expect_identical(tf_of(c(keras3, "tensorflow-cpu==2.21.1")), character())
  expect_identical(tf_of(c(keras3, "tf-nightly")), character())
})

test_that("on a platform without TensorFlow 2.21, the problem says so", {
  wanted <- python_requirements(character(), requirements = core_requirements(pyproject()),
                                environment = intel_mac, gpu = FALSE)
  expect_match(wanted$problem, "no build for this platform \\(darwin on x86_64\\)")
  expect_false(any(requirement_name(wanted$packages) %in% tensorflow_distributions))
})

test_that("find_python() leaves the choice to py_require() with reticulate >= 1.41 only", {
  root <- withr::local_tempdir()
  withr::local_envvar(RETICULATE_PYTHON = NA, MULTIGPU_PYTHON = NA,
                      RETICULATE_USE_MANAGED_VENV = NA,
                      WORKON_HOME = file.path(root, "envs"))
  withr::local_options(multigpu.python = NULL)
  expect_identical(reticulate_provisions("1.46.0"), TRUE)
  expect_identical(reticulate_provisions("1.28"), FALSE)
  withr::local_envvar(RETICULATE_USE_MANAGED_VENV = "no")
  expect_false(reticulate_provisions("1.46.0"))
  withr::local_envvar(RETICULATE_USE_MANAGED_VENV = NA)
  choice <- find_python(root)
  if (utils::packageVersion("reticulate") >= "1.41") {
    expect_true(choice$managed)
    expect_match(choice$source, "py_require")
  } else {
    expect_null(choice$managed)
    expect_identical(choice$source, "reticulate's default discovery")
  }
})

test_that("the failures of the py_require() environment say what to do", {
  no_uv <- provision_problem("Installation of Python not found", uv = NULL,
                             requested = "keras")
  expect_identical(attr(no_uv, "reason"), "uv")
  expect_match(no_uv, "needs uv, which is not installed")
  expect_match(no_uv, "pip install uv")
  expect_match(no_uv, "install_multigpu()", fixed = TRUE)

  withr::local_envvar(UV_PYTHON_DOWNLOADS = "never")
  no_python <- provision_problem(paste(
    "Error : Requested Python version constraints could not be satisfied.",
    "  constraints: \">=3.10,<3.14\"",
    "Available Python versions found: 3.9.18, 3.8.20", sep = "\n"),
    uv = "/usr/bin/uv", requested = "keras")
  expect_identical(attr(no_python, "reason"), "python")
  expect_match(no_python, "found no Python 3.10 to 3.13")
  expect_match(no_python, "it found: 3.9.18, 3.8.20", fixed = TRUE)
  expect_match(no_python, "UV_PYTHON_DOWNLOADS is never", fixed = TRUE)

  no_wheel <- provision_problem("Call `py_require()` to remove or replace conflicting requirements.",
                                uv = "/usr/bin/uv", requested = "keras")
  expect_identical(attr(no_wheel, "reason"), "resolution")
  expect_match(no_wheel, "without a build (a wheel) for this platform", fixed = TRUE)
})

test_that("the cached copy of the core is what uv builds, and is reused", {
  cache <- withr::local_tempdir()
  source <- file.path(withr::local_tempdir(), "core")
  dir.create(file.path(source, "python", "multigpu"), recursive = TRUE)
  writeLines('name = "multigpu"', file.path(source, "pyproject.toml"))
  writeLines("# readme", file.path(source, "README.md"))
  writeLines('__version__ = "0.1.0"', file.path(source, "python", "multigpu", "__init__.py"))
  first <- cached_core(source, cache)
  expect_true(file.exists(file.path(first, "python", "multigpu", "__init__.py")))
  expect_identical(cached_core(source, cache), first)
  # Another core (same version, other files) is another path for uv's cache.
  writeLines("x = 1", file.path(source, "python", "multigpu", "extra.py"))
  expect_false(identical(cached_core(source, cache), first))
})
