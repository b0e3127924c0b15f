# 96 rows in batches of 16: 6 steps an epoch.
monitored_fit <- function(model, monitor, epochs = 2) {
  x <- matrix(runif(96 * 4), ncol = 4)
  model |> fit(x, as.integer(rowSums(x) > 2), batch_size = 16, epochs = epochs,
               verbose = 0, shuffle = FALSE, callbacks = list(monitor))
}

test_that("callback_scaling_monitor() measures a fit: throughput, baseline, efficiency", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel(metrics = NULL)
  monitor <- callback_scaling_monitor(baseline_steps = 2, warn = FALSE)
  expect_s3_class(monitor, "keras.src.callbacks.callback.Callback")
  monitored_fit(parallel, monitor)
  result <- summary(monitor)
  expect_identical(result$devices, 2L)
  expect_identical(result$engine, "replicate")
  expect_identical(result$batch_size, 16L)
  expect_identical(result$steps, 12L - 2L)
  expect_gt(result$samples_per_second, 0)
  expect_equal(result$speedup, result$baseline_step_seconds / result$step_seconds)
  expect_equal(result$efficiency, result$speedup / 2)
  expect_identical(result$communication_seconds, 0)
  expect_identical(result$input_wait_seconds, NA)
  expect_match(result$notes, "input", all = FALSE)
})

test_that("the monitor warns in R when one device would be faster", {
  skip_if_no_multigpu()
  monitor <- callback_scaling_monitor(baseline_steps = 1)
  # A baseline step far faster than any measured one.
  reticulate::py_set_attr(monitor, "_measure_baseline", function(batch) {
    reticulate::py_set_attr(monitor, "_baseline_seconds", 1e-9)
  })
  expect_warning(monitored_fit(compiled_parallel(metrics = NULL), monitor),
                 "One device would be faster", class = "multigpu_warning")
})

test_that("a monitor of a model under mirrored_strategy(), and without baseline", {
  skip_if_no_multigpu()
  strategy <- mirrored_strategy(2)
  with(strategy$scope(), {
    model <- tiny_model(outputs = 2L)
    model |> compile(optimizer = "sgd", loss = "sparse_categorical_crossentropy")
  })
  monitor <- callback_scaling_monitor(baseline_steps = 0)
  monitored_fit(model, monitor, epochs = 1)
  result <- summary(monitor)
  expect_identical(result$engine, "strategy")
  expect_gt(result$samples_per_second, 0)
  expect_identical(result$efficiency, NA)
})

test_that("plot() draws the measured steps and the baseline levels", {
  skip_if_no_multigpu()
  monitor <- callback_scaling_monitor(baseline_steps = 2, warn = FALSE)
  monitored_fit(compiled_parallel(metrics = NULL), monitor)
  path <- tempfile(fileext = ".png")
  grDevices::png(path)
  drawn <- plot(monitor)
  grDevices::dev.off()
  expect_true(file.size(path) > 0)
  expect_identical(drawn$step, 2:11)
  one <- summary(monitor)$baseline_samples_per_second
  expect_equal(unname(attr(drawn, "levels")), c(one, 2 * one))
  expect_named(attr(drawn, "levels"), c("one device", "ideal, 2 devices"))
  expect_error(plot(callback_scaling_monitor()), "measured no step",
               class = "multigpu_value_error")
})

test_that("callback_scaling_monitor() names bad arguments", {
  skip_if_no_multigpu()
  expect_error(callback_scaling_monitor(baseline_steps = -1), "`baseline_steps` is negative",
               class = "multigpu_value_error")
  expect_error(callback_scaling_monitor(link = "ethernet"),
               'Invalid `link`: received "ethernet"; expected NULL or one of',
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(callback_scaling_monitor(warn = NA), "`warn`")
})
