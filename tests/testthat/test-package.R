test_that("loading the package starts neither Python nor TensorFlow, so virtual_devices() still works", {
  skip_if_no_multigpu()
  output <- run_r('
    Sys.unsetenv("TF_CPP_MIN_LOG_LEVEL")
    library(multigpu)
    cat("started after library():", reticulate::py_available(), "\\n")
    cat("TF_CPP_MIN_LOG_LEVEL:", Sys.getenv("TF_CPP_MIN_LOG_LEVEL"), "\\n")
    cat("virtual devices:", virtual_devices(3), "\\n")
    cat("CPU devices:", length(available_devices()$CPU), "\\n")
  ', env = paste0("RETICULATE_PYTHON=", multigpu_config()$python))
  output <- paste(output, collapse = "\n")
  expect_match(output, "started after library(): FALSE", fixed = TRUE)
  expect_match(output, "TF_CPP_MIN_LOG_LEVEL: 2", fixed = TRUE)
  expect_match(output, "virtual devices: /device:CPU:0 /device:CPU:1 /device:CPU:2", fixed = TRUE)
  expect_match(output, "CPU devices: 3", fixed = TRUE)
})

test_that("the pipe and the training generics are keras3's, re-exported", {
  expect_identical(multigpu::`%>%`, magrittr::`%>%`)
  expect_identical(multigpu::compile, keras3::compile)
  expect_identical(multigpu::fit, keras3::fit)
  expect_identical(multigpu::evaluate, keras3::evaluate)
})
