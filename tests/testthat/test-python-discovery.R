# How multigpu chooses the Python it uses (python-discovery.R).

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

  # 6-7. Nothing configured: reticulate decides, from py_require()
  # declarations with reticulate >= 1.41.
  withr::local_envvar(RETICULATE_USE_MANAGED_VENV = NA)
  choice <- find_python(wd)
  expect_null(choice$python)
  if (utils::packageVersion("reticulate") >= "1.41") {
    expect_true(choice$managed)
    expect_identical(choice$source, managed_source)
    withr::with_envvar(c(RETICULATE_USE_MANAGED_VENV = "no"), {
      expect_identical(find_python(wd)$source, "reticulate's default discovery")
    })
  } else {
    expect_identical(choice$source, "reticulate's default discovery")
  }

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
