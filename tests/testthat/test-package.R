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

test_that("the pipe and the training generics are re-exported from magrittr and generics", {
  expect_identical(multigpu::`%>%`, magrittr::`%>%`)
  expect_identical(multigpu::compile, generics::compile)
  expect_identical(multigpu::fit, generics::fit)
  # With tensorflow installed, evaluate() is its generic, the one keras3
  # exports too: attaching both packages masks nothing.
  if (nzchar(system.file(package = "tensorflow"))) {
    expect_identical(multigpu::evaluate, getExportedValue("tensorflow", "evaluate"))
  } else {
    expect_identical(multigpu::evaluate, generics::evaluate)
  }
})

test_that("the training methods do not take over keras3's class", {
  # keras3 registers its methods for keras.src.models.model.Model, which
  # comes first in a model's class vector; ours are for the Trainer class
  # after it, so with keras3 loaded its methods win and nothing is
  # overwritten.
  for (generic in c("compile", "fit", "evaluate", "predict")) {
    expect_null(utils::getS3method(generic, "keras.src.models.model.Model", optional = TRUE))
    expect_type(utils::getS3method(generic, "keras.src.trainers.trainer.Trainer"), "closure")
  }
  skip_if_no_multigpu()
  classes <- class(tiny_model())
  expect_lt(match("keras.src.models.model.Model", classes),
            match("keras.src.trainers.trainer.Trainer", classes))
})
