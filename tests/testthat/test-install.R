test_that("install_multigpu() rejects bad arguments before doing anything", {
  expect_error(install_multigpu(envname = NA_character_), "`envname` must be a single string",
               class = "multigpu_value_error")
  expect_error(install_multigpu(gpu = "yes"), "`gpu` must be TRUE, FALSE or NA, not \"yes\"",
               fixed = TRUE, class = "multigpu_value_error")
})

test_that("the Python package this R package carries has the R package's version", {
  init <- readLines(system.file("python", "python", "multigpu", "__init__.py",
                                package = "multigpu"))
  version <- sub('^__version__ = "(.*)"$', "\\1", grep("^__version__ = ", init, value = TRUE))
  expect_identical(version, as.character(utils::packageVersion("multigpu")))
})
