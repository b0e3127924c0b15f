test_that("memory_plan() counts weights, gradients and Adam's and SGD's variables exactly", {
  skip_if_no_multigpu()
  model <- tiny_model()   # 4 -> 8 -> 3: 67 float32 weights, all trainable
  weights <- 4 * (4 * 8 + 8 + 8 * 3 + 3)
  plan <- memory_plan(model, batch_size = 10, gpus = 2, optimizer = "adam")
  expect_s3_class(plan, "multigpu_memory_plan")
  expect_identical(plan$weights, weights)
  expect_identical(plan$gradients, weights)
  expect_identical(plan$optimizer, 2 * weights + 8 + 4)   # m, v, iterations, learning rate
  expect_identical(memory_plan(model, 10, gpus = 2, optimizer = "sgd")$optimizer, 12)
  expect_identical(plan$total, plan$weights + plan$gradients + plan$optimizer + plan$activations)
  expect_identical(plan$per_replica_batch, 5L)
  # The batch (5 x 4), and 5 x 8 twice (product, bias) for the hidden layer
  # and its relu, 5 x 3 twice for the scores and their softmax.
  expect_identical(plan$activations, 4 * (5 * 4 + 3 * 5 * 8 + 3 * 5 * 3))
  expect_identical(plan$devices, c("/device:CPU:0", "/device:CPU:1"))
  expect_identical(plan$device_memory, c(`/device:CPU:0` = NA_real_, `/device:CPU:1` = NA_real_))
  expect_identical(plan$fits, NA)
  expect_output(print(plan), "optimizer +548 B +548")
  expect_output(print(plan), "memory not reported by TensorFlow")
})

test_that("memory_plan() uses the compiled optimizer and compares with device_memory", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()   # adam
  plan <- memory_plan(parallel, batch_size = 16, gpus = 2)
  expect_identical(plan$optimizer, 2 * plan$gradients + 12)
  expect_true(memory_plan(parallel, 16, gpus = 2, device_memory = 2^30)$fits)
  expect_false(memory_plan(parallel, 16, gpus = 2, device_memory = plan$total - 1)$fits)
})

test_that("memory_plan() names bad arguments in R terms", {
  skip_if_no_multigpu()
  expect_error(memory_plan(tiny_model(), batch_size = 0, gpus = 2, optimizer = "sgd"),
               "Invalid `batch_size`: received 0; expected the global batch, a whole number >= 1",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(memory_plan(tiny_model(), 8, gpus = 2),
               "Invalid `optimizer`: received NULL and the model is not compiled",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(memory_plan(tiny_model(), 8, gpus = 2, optimizer = "sgd", device_memory = "16GB"),
               'Invalid `device_memory`: received "16GB"', fixed = TRUE,
               class = "multigpu_value_error")
  expect_error(memory_plan("model", 8, gpus = 2), class = "multigpu_type_error")
})

test_that("find_batch_size() returns the largest global batch whose plan fits", {
  skip_if_no_multigpu()
  model <- tiny_model(inputs = 64L, units = 256L, outputs = 10L)
  memory <- 2 * 2^20
  batch <- find_batch_size(model, gpus = 4, device_memory = memory, optimizer = "adam")
  expect_type(batch, "integer")
  expect_identical(batch %% 4L, 0L)
  expect_true(memory_plan(model, batch, gpus = 4, optimizer = "adam", device_memory = memory)$fits)
  expect_false(memory_plan(model, batch + 4L, gpus = 4, optimizer = "adam", device_memory = memory)$fits)
  expect_identical(find_batch_size(model, gpus = 4, device_memory = memory, optimizer = "adam",
                                   trial = TRUE), batch)
  expect_error(find_batch_size(model, gpus = 4, optimizer = "adam"),
               "Invalid `device_memory`: received NULL, but TensorFlow does not report",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(find_batch_size(model, gpus = 4, optimizer = "adam", device_memory = 1000),
               "Not even one row per device fits", class = "multigpu_value_error")
})
