# The core's messages reach R users in R spelling: NULL, TRUE, c(...), and
# the R functions' calls (virtual_devices(n)), never Python's None, True,
# ['...'] or multigpu.virtual_devices(). speaks_r() is in helper-scenarios.R.

expect_speaks_r <- function(condition, pattern) {
  message <- conditionMessage(condition)
  expect_true(speaks_r(message), label = message)
  expect_match(message, pattern, fixed = TRUE)
}

test_that("speaks_r() tells R spelling from Python spelling", {
  expect_true(speaks_r('received c("/gpu:0"); expected NULL or TRUE; call virtual_devices(n)'))
  expect_false(speaks_r("expected None"))
  expect_false(speaks_r("expected True or False"))
  expect_false(speaks_r("received ['/gpu:0']"))
  expect_false(speaks_r("received [0, 1]"))
  expect_false(speaks_r("call multigpu.virtual_devices(n) first"))
})

test_that("argument errors from the core read in R", {
  skip_if_no_multigpu()
  model <- tiny_model()
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = "a"), error = identity),
                  'received list("a"). A device list needs at least 2 entries, not 1. Expected NULL')
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = c(0, 1)), error = identity),
                  'a list of >= 2 distinct device names such as c("/gpu:0", "/gpu:1")')
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = 64), error = identity),
                  "call virtual_devices(n) before TensorFlow starts")
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = 2, cpu_merge = FALSE,
                                           engine = "mirrored"), error = identity),
                  'received FALSE with engine = "mirrored"')
  expect_speaks_r(tryCatch(distributed_dataset(iris_x(), shuffle = "yes"), error = identity),
                  'received "yes"; expected TRUE or FALSE')
  expect_speaks_r(tryCatch(mirrored_strategy(cross_device_ops = "bogus"), error = identity),
                  "expected NULL (collective all-reduce)")
})

test_that("a late virtual_devices() names the R call", {
  skip_if_no_multigpu()
  available_devices()  # TensorFlow has started
  expect_speaks_r(tryCatch(virtual_devices(8), error = identity),
                  "virtual_devices(8) came too late")
})
