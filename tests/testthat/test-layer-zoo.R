# Layers with behaviour of their own, built with keras3 as R users build
# them, through multi_gpu_model() against the same model trained on one
# device (tests/python/engines/test_layer_zoo.py runs every layer family in depth).
# On 2 devices: batches of 10 rows split 5/5, the last 3 rows 2/1; each
# more device is another replica to trace, and Python covers the empty share.
# The engine products are a zoo (helper-tiers.R): each engine in the full
# tier, the gate's rotation otherwise.

zoo_features <- function(rows, seed = 3) {
  set.seed(seed)
  matrix(rnorm(rows * 6, mean = 2, sd = 4), rows, 6)
}

zoo_targets <- function(x) tanh(x %*% matrix(seq(-1, 1, length.out = 12), 6, 2) / 8)

# Builds the model that `build()` makes twice from one seed: the template
# and a reference with the same weights and adapted state.
zoo_twins <- function(build) {
  lapply(1:2, function(i) {
    keras3::set_random_seed(21)
    build()
  })
}

zoo_trains_as_on_one_device <- function(build, x, y, engine) {
  twins <- zoo_twins(build)
  parallel <- multi_gpu_model(twins[[1]], gpus = 2, engine = engine)
  expect_equal(predict(parallel, x, batch_size = 10, verbose = 0),
               predict(twins[[2]], x, batch_size = 10, verbose = 0),
               tolerance = 1e-5)
  for (model in list(parallel, twins[[2]])) {
    model |> compile(optimizer = keras3::optimizer_sgd(0.05, momentum = 0.5),
                     loss = "mse")
  }
  ours <- parallel |> fit(x, y, batch_size = 10, epochs = 2, shuffle = FALSE,
                          verbose = 0)
  theirs <- twins[[2]] |> fit(x, y, batch_size = 10, epochs = 2,
                              shuffle = FALSE, verbose = 0)
  expect_equal(ours$metrics$loss, theirs$metrics$loss, tolerance = 1e-5)
  expect_equal(keras3::get_weights(twins[[1]]), keras3::get_weights(twins[[2]]),
               tolerance = 1e-5)
}

test_that("layer_normalization() with adapt() trains as on one device", {
  skip_if_no_multigpu()
  x <- zoo_features(23)
  build <- function() {
    norm <- keras3::layer_normalization()
    keras3::adapt(norm, zoo_features(40, seed = 11))
    inputs <- keras3::keras_input(shape = 6)
    outputs <- inputs |> norm() |> keras3::layer_dense(5, activation = "relu") |>
      keras3::layer_dense(2)
    keras3::keras_model(inputs, outputs)
  }
  for (engine in zoo_engines("layers", "normalization_adapt")) {
    zoo_trains_as_on_one_device(build, x, zoo_targets(x), engine)
  }
})

test_that("a layer calling add_loss() trains as on one device", {
  skip_if_no_multigpu()
  layer_row_penalty <- keras3::Layer(
    "RowPenalty",
    call = function(inputs) {
      row_means <- keras3::op_mean(inputs, axis = -1)
      self$add_loss(0.5 * keras3::op_mean(keras3::op_square(row_means)))
      inputs
    }
  )
  build <- function() {
    inputs <- keras3::keras_input(shape = 6)
    outputs <- inputs |> keras3::layer_dense(5, activation = "tanh") |>
      layer_row_penalty() |> keras3::layer_dense(2)
    keras3::keras_model(inputs, outputs)
  }
  x <- zoo_features(23)
  zoo_trains_as_on_one_device(build, x, zoo_targets(x), "replicate")
  # The mirrored engine traces each replica in a thread of its own, where
  # R code cannot run: refused, and engine = "auto" keeps the replicate one.
  expect_error(multi_gpu_model(build(), gpus = 2, engine = "mirrored"),
               "\"row_penalty[_0-9]*\" \\(RowPenalty\\) runs R code",
               class = "multigpu_value_error")
  expect_equal(multi_gpu_model(build(), gpus = 2)$engine, "replicate")
})

test_that("a variational autoencoder whose sampling layer adds its KL term trains", {
  skip_if_no_multigpu()
  layer_sampling <- keras3::Layer(
    "VaeSampling",
    initialize = function(...) {
      super$initialize(...)
      self$seeds <- keras3::random_seed_generator(7)
    },
    call = function(inputs) {
      z_mean <- inputs[[1]]
      z_log_var <- inputs[[2]]
      kl <- -0.5 * keras3::op_mean(keras3::op_sum(
        1 + z_log_var - keras3::op_square(z_mean) - keras3::op_exp(z_log_var),
        axis = -1))
      self$add_loss(kl)
      noise <- keras3::random_normal(keras3::op_shape(z_mean), seed = self$seeds)
      z_mean + keras3::op_exp(0.5 * z_log_var) * noise
    }
  )
  x <- zoo_features(46) / 4
  # A layer written in R: the replicate engine (see the add_loss() test).
  for (engine in c("auto", "replicate")) {
    keras3::set_random_seed(21)
    inputs <- keras3::keras_input(shape = 6)
    hidden <- inputs |> keras3::layer_dense(8, activation = "relu")
    z <- layer_sampling(list(hidden |> keras3::layer_dense(2),
                             hidden |> keras3::layer_dense(2)))
    outputs <- z |> keras3::layer_dense(8, activation = "relu") |>
      keras3::layer_dense(6)
    vae <- keras3::keras_model(inputs, outputs)
    parallel <- multi_gpu_model(vae, gpus = 2, engine = engine)
    parallel |> compile(optimizer = keras3::optimizer_adam(0.01), loss = "mse")
    history <- parallel |> fit(x, x, batch_size = 10, epochs = 6, verbose = 0)
    loss <- history$metrics$loss
    expect_true(all(is.finite(loss)))
    expect_lt(loss[6], loss[1])
  }
})

test_that("layer_lstm(dropout = 0.2) trains on each engine", {
  skip_if_no_multigpu()
  set.seed(4)
  tokens <- matrix(sample.int(19L, 23 * 7, replace = TRUE), 23, 7)
  labels <- sample(0:2, 23, replace = TRUE)
  for (engine in zoo_engines("layers", "lstm_dropout")) {
    keras3::set_random_seed(21)
    inputs <- keras3::keras_input(shape = 7, dtype = "int32")
    outputs <- inputs |> keras3::layer_embedding(20, 4, mask_zero = TRUE) |>
      keras3::layer_lstm(4, dropout = 0.2, recurrent_dropout = 0.1) |>
      keras3::layer_dense(3, activation = "softmax")
    template <- keras3::keras_model(inputs, outputs)
    before <- keras3::get_weights(template)
    parallel <- multi_gpu_model(template, gpus = 2, engine = engine)
    parallel |> compile(optimizer = keras3::optimizer_sgd(0.05),
                        loss = "sparse_categorical_crossentropy")
    history <- parallel |> fit(tokens, labels, batch_size = 10, epochs = 2,
                               verbose = 0)
    expect_true(all(is.finite(history$metrics$loss)))
    moved <- mapply(function(a, b) max(abs(a - b)), keras3::get_weights(template), before)
    expect_gt(max(moved), 1e-4)
  }
})

test_that("a model with its own train_step is refused, naming it and the strategy", {
  skip_if_no_multigpu()
  custom_model <- keras3::new_model_class(
    "CustomStep",
    train_step = function(data) {
      list(custom = keras3::op_zeros(list()))
    }
  )
  inputs <- keras3::keras_input(shape = 4)
  model <- custom_model(inputs, inputs |> keras3::layer_dense(2))
  expect_error(multi_gpu_model(model, gpus = 2), "defines its own `train_step`",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, gpus = 2),
               "with(mirrored_strategy()$scope(), {...})", fixed = TRUE)
})
