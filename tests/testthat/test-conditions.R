# The classed conditions multigpu signals (conditions.R).

test_that("multigpu_abort() signals classed errors with the caller's call", {
  f <- function() multigpu_abort("bad value", call = quote(f(x = 1)))
  error <- tryCatch(f(), error = identity)
  expect_s3_class(error, c("multigpu_value_error", "multigpu_error", "error", "condition"), exact = TRUE)
  expect_identical(conditionMessage(error), "bad value")
  expect_identical(conditionCall(error), quote(f(x = 1)))
  error <- tryCatch(multigpu_abort("x", class = "multigpu_install_error"), error = identity)
  expect_s3_class(error, c("multigpu_install_error", "multigpu_error", "error", "condition"), exact = TRUE)
})

test_that("tryCatch() can catch Python errors by class", {
  skip_if_no_multigpu()
  caught <- tryCatch(
    multi_gpu_model(tiny_model(), gpus = 64),
    multigpu_value_error = function(e) conditionMessage(e)
  )
  expect_match(caught, "64 devices were asked for but only 4 logical CPU device(s) exist", fixed = TRUE)
})

test_that("every condition class has a help page: ?multigpu_os_error and the others resolve", {
  path <- getNamespaceInfo("multigpu", "path")
  source_rd <- file.path(path, "man", "multigpu-conditions.Rd")
  rd <- if (file.exists(source_rd)) {
    tools::parse_Rd(source_rd)
  } else {
    tools::Rd_db("multigpu")[["multigpu-conditions.Rd"]]
  }
  tags <- vapply(rd, attr, "", "Rd_tag")
  aliases <- vapply(rd[tags == "\\alias"], function(alias) as.character(alias[[1]]), "")
  classes <- c(unname(python_error_classes), "multigpu_error", "multigpu_python_error",
               "multigpu_version_error", "multigpu_install_error", "multigpu_warning")
  expect_setequal(intersect(classes, aliases), classes)
})
