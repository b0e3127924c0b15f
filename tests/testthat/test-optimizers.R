# Keras's optimizer options on both engines, from R: gradient clipping, the
# moving average of the weights, and mixed_float16's loss scale. A keras3
# model trained through multi_gpu_model() on 2 devices ends where the same
# model trained by plain keras3 fit() on one device ends: the optimizer runs
# once, on the whole batch's gradient (tests/python/engines/
# test_optimizer_zoo.py has every optimizer class and option).
#
# Each one-device reference is trained once and serves every engine the case
# runs on: both in the full tier, the gate's rotation otherwise
# (zoo_engines("optimizers", case), helper-tiers.R).

# keras3's model of the Python zoo: 5 features -> 6 tanh units -> 2 outputs.
# The weights are `weights` (a list from get_weights()) when given.
zoo_model <- function(weights = NULL, output_dtype = NULL) {
  model <- keras3::keras_model_sequential(input_shape = 5) |>
    keras3::layer_dense(6, activation = "tanh") |>
    keras3::layer_dense(2, dtype = output_dtype)
  if (!is.null(weights)) keras3::set_weights(model, weights)
  model
}

# 11 rows of a noisy linear regression: batches of 4 rows split 2/2 on
# 2 devices, the last batch of 3 rows splits 2/1.
zoo_data <- function(rows = 11) {
  withr::with_seed(11, {
    x <- matrix(rnorm(rows * 5), rows, 5)
    y <- x %*% matrix(rnorm(10), 5, 2) + 0.1 * matrix(rnorm(rows * 2), rows, 2)
  })
  list(x = x, y = y)
}

# Compiles `model` with `optimizer` and an MSE loss, then fits it on
# `data` in order; returns the training history.
fit_in_order <- function(model, optimizer, data, batch_size = 4, epochs = 2) {
  model |> compile(optimizer = optimizer, loss = "mse")
  model |> fit(data$x, data$y, batch_size = batch_size, epochs = epochs,
               shuffle = FALSE, verbose = 0)
}

# The largest absolute difference between two lists of weight arrays.
max_difference <- function(weights, others) {
  max(mapply(function(a, b) max(abs(a - b)), weights, others))
}

# Trains the zoo model from `initial` through multi_gpu_model() on each of
# `engines` with a fresh `make_optimizer()`, and expects it to end within
# `tolerance` of `reference` (list(weights, history) from one device).
expect_as_on_one_device <- function(make_optimizer, initial, reference, data,
                                    engines, tolerance = 1e-5) {
  for (engine in engines) {
    template <- zoo_model(initial)
    parallel <- multi_gpu_model(template, gpus = 2, engine = engine)
    history <- tryCatch(fit_in_order(parallel, make_optimizer(), data),
                        error = function(error) {
      fail(sprintf("engine = \"%s\": fit() failed: %s", engine,
                   conditionMessage(error)))
      NULL
    })
    if (is.null(history)) next
    expect_lt(max_difference(keras3::get_weights(template), reference$weights),
              tolerance,
              label = sprintf("engine = \"%s\": the weights' largest difference from one device",
                              engine))
    expect_equal(history$metrics$loss, reference$history$metrics$loss,
                 tolerance = tolerance,
                 label = sprintf("engine = \"%s\": the epochs' losses", engine))
  }
}

# Trains with `make_optimizer()` on one device; checks that the same
# optimizer without the option (`make_plain()`) ends elsewhere, so the option
# matters on this data, and that each of `engines` ends where one device
# does.
expect_option_as_on_one_device <- function(engines, make_optimizer, make_plain) {
  data <- zoo_data()
  initial <- keras3::get_weights(zoo_model())
  alone <- zoo_model(initial)
  history <- fit_in_order(alone, make_optimizer(), data)
  reference <- list(weights = keras3::get_weights(alone), history = history)
  plain <- zoo_model(initial)
  fit_in_order(plain, make_plain(), data)
  expect_gt(max_difference(keras3::get_weights(plain), reference$weights), 1e-3)

  expect_as_on_one_device(make_optimizer, initial, reference, data,
                          engines = engines)
}

test_that("gradient clipping clips the whole batch's gradient, as on one device, on each engine", {
  skip_if_no_multigpu()
  expect_option_as_on_one_device(
    zoo_engines("optimizers", "clipnorm"),
    function() keras3::optimizer_sgd(learning_rate = 0.1, clipnorm = 1),
    function() keras3::optimizer_sgd(learning_rate = 0.1))
})

test_that("Adam's moving average of the weights (use_ema) trains as on one device, on each engine", {
  skip_if_no_multigpu()
  expect_option_as_on_one_device(
    zoo_engines("optimizers", "use_ema"),
    function() {
      keras3::optimizer_adam(learning_rate = 0.01, use_ema = TRUE,
                             ema_momentum = 0.5, ema_overwrite_frequency = 2)
    },
    function() keras3::optimizer_adam(learning_rate = 0.01))
})

test_that("under mixed_float16, a batch that overflows on one device is skipped on every device, as on one device", {
  skip_if_no_multigpu()
  previous <- keras3::config_dtype_policy()
  keras3::config_set_dtype_policy("mixed_float16")
  withr::defer(keras3::config_set_dtype_policy(previous))
  # 8 rows in batches of 4: every batch's last row (the second device's
  # share) has targets 3000 times larger, whose gradient overflows float16
  # under the initial loss scale of 2^15; the first device's stays finite.
  data <- zoo_data(rows = 8)
  data$y[c(4, 8), ] <- data$y[c(4, 8), ] * 3000
  # The output in float32, as Keras's mixed-precision guide advises.
  initial <- keras3::get_weights(zoo_model(output_dtype = "float32"))
  alone <- zoo_model(initial, output_dtype = "float32")
  fit_in_order(alone, keras3::optimizer_sgd(learning_rate = 1e-4), data, epochs = 3)
  scale <- as.numeric(alone$optimizer$dynamic_scale$numpy())
  weights <- keras3::get_weights(alone)
  expect_lt(scale, 2^15)  # one device skipped steps

  for (engine in zoo_engines("optimizers", "mixed_float16_skipped_steps")) {
    template <- zoo_model(initial, output_dtype = "float32")
    parallel <- multi_gpu_model(template, gpus = 2, engine = engine)
    fit_in_order(parallel, keras3::optimizer_sgd(learning_rate = 1e-4), data,
                 epochs = 3)
    label <- sprintf("engine = \"%s\"", engine)
    expect_s3_class(parallel$optimizer, "keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer")
    # The same steps skipped: the same scale, and weights that stay finite.
    expect_identical(as.numeric(parallel$optimizer$dynamic_scale$numpy()), scale,
                     label = paste0(label, ": the loss scale"))
    got <- keras3::get_weights(template)
    expect_true(all(vapply(got, function(w) all(is.finite(w)), logical(1))),
                label = paste0(label, ": every weight is finite"))
    # Within float16's rounding of the forward and backward pass.
    expect_lt(max_difference(got, weights), 1e-3,
              label = paste0(label, ": the weights' largest difference from one device"))
  }
})
