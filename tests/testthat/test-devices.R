test_that("available_devices() lists the simulated devices as character vectors", {
  skip_if_no_multigpu()
  devices <- available_devices()
  expect_named(devices, c("GPU", "CPU"))
  expect_identical(devices$GPU, character())
  expect_identical(devices$CPU, sprintf("/device:CPU:%d", 0:3))
})

test_that("virtual_devices() with the same n again is harmless", {
  skip_if_no_multigpu()
  expect_identical(virtual_devices(4), sprintf("/device:CPU:%d", 0:3))
  expect_identical(virtual_devices(4L, device_type = "cpu"), sprintf("/device:CPU:%d", 0:3))
})

test_that("virtual_devices() while a model exists says what exists and how to fix it", {
  skip_if_no_multigpu()
  model <- tiny_model()
  error <- tryCatch(virtual_devices(2), error = identity)
  expect_s3_class(error, c("multigpu_runtime_error", "multigpu_python_error", "multigpu_error"))
  expect_match(conditionMessage(error), "virtual_devices(2) came too late", fixed = TRUE)
  expect_match(conditionMessage(error), "Keras model", fixed = TRUE)
  expect_match(conditionMessage(error), "right after library(keras3) and library(multigpu); remove what exists with rm()", fixed = TRUE)
  expect_identical(conditionCall(error), quote(virtual_devices(2)))
  expect_identical(available_devices()$CPU, sprintf("/device:CPU:%d", 0:3))
})

test_that("virtual_devices() restarts a TensorFlow whose tensors are gone", {
  # The restart is the core's: test_devices.py runs it in the gate.
  skip_unless_full_tier("a child R process for a restart the Python suite checks")
  skip_if_no_multigpu()
  output <- run_r(c(
    "library(multigpu)",
    "tf <- reticulate::import('tensorflow')",
    "x <- tf$constant(1)  # TensorFlow starts with one CPU device",
    "rm(x)",
    "cat('devices:', virtual_devices(2), '\\n')",
    "y <- tf$constant(1)",
    "e <- tryCatch(virtual_devices(3), error = conditionMessage)",
    "cat('refused:', grepl('1 tensor', e), '\\n')"
  ))
  expect_identical(attr(output, "status"), 0L)
  expect_true("devices: /device:CPU:0 /device:CPU:1 " %in% output)
  expect_true("refused: TRUE " %in% output)
})

test_that("virtual_devices() rejects NA, negative and non-whole n in R", {
  expect_error(virtual_devices(NA), "`n` contains NA or NaN", class = "multigpu_value_error")
  expect_error(virtual_devices(-1), "`n` is negative", class = "multigpu_value_error")
  expect_error(virtual_devices(2.5), "`n` is not a whole number: received 2.5", class = "multigpu_value_error")
  expect_error(virtual_devices(c(2, 4)), "`n` must be a single whole number", class = "multigpu_value_error")
  expect_error(virtual_devices(4, memory_limit = -5), "`memory_limit` is negative", class = "multigpu_value_error")
  expect_error(virtual_devices(4, threads = 1.5), "`threads` is not a whole number: received 1.5", class = "multigpu_value_error")
})

test_that("virtual_devices() leaves the rest to Python, whose message reaches R", {
  skip_if_no_multigpu()
  error <- tryCatch(virtual_devices(0), error = identity)
  expect_s3_class(error, c("multigpu_value_error", "multigpu_python_error"))
  expect_match(conditionMessage(error), "Invalid `n`: received 0; expected an int >= 1", fixed = TRUE)
  # memory_limit = 1024 arrives as the Python int 1024, not 1024.0.
  expect_error(virtual_devices(4, memory_limit = 1024),
               "Invalid `memory_limit`: received 1024 for CPU devices", fixed = TRUE,
               class = "multigpu_value_error")
  # threads = 2 arrives as the Python int 2 (a float would be refused).
  expect_error(virtual_devices(4, device_type = "GPU", memory_limit = 1024, threads = 2),
               "Invalid `threads`: received 2 for GPU devices", fixed = TRUE,
               class = "multigpu_value_error")
  expect_error(virtual_devices(4, device_type = "TPU"),
               'Invalid `device_type`: received "TPU"', fixed = TRUE,
               class = "multigpu_value_error")
})
