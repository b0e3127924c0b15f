# check_equivalence(): a correct model agrees on every engine; batch
# normalization on per-device shares and, under a strategy, a loss that
# averages the rows itself are reported with their cause, in R terms; so is
# an engine's copy that lost a layer's state.

equivalence_data <- function(rows = 48L) {
  set.seed(3)
  x <- matrix(rnorm(rows * 4L), ncol = 4L)
  list(x = x, classes = factor(sample(c("a", "b", "c"), rows, replace = TRUE)),
       values = matrix(rowSums(x), ncol = 1L))
}

normalized_model <- function() {
  keras <- keras_py()
  keras$Sequential(list(
    keras$Input(shape = list(4L)),
    keras$layers$Dense(8L, activation = "relu"),
    keras$layers$BatchNormalization(name = "norm"),
    keras$layers$Dense(3L, activation = "softmax")
  ))
}

test_that("a correct model trains alike on one device and on every engine", {
  skip_if_no_multigpu()
  data <- equivalence_data()
  model <- tiny_model()
  model$compile(optimizer = "adam", loss = "sparse_categorical_crossentropy",
                metrics = list("accuracy"))
  before <- model$get_weights()
  for (engine in c("replicate", "mirrored", "strategy")) {
    report <- check_equivalence(model, data$x, data$classes, gpus = 4,
                                engine = engine)
    expect_s3_class(report, "multigpu_equivalence")
    expect_true(report$equal)
    expect_named(report$differences,
                 c("loss", "accuracy", "weights", "optimizer_state"))
    expect_true(all(report$differences <= 1e-5))
    expect_null(report$first_difference)
    expect_null(report$cause)
    expect_identical(report$engine, engine)
    expect_identical(report$requested_engine, engine)
    expect_identical(c(report$steps, report$batch_size), c(3L, 16L))
    expect_length(report$devices, 4L)
    expect_output(print(report), sprintf('engine = "%s" on 4 devices: equal within tolerance = 0.0001', engine))
  }
  expect_equal(model$get_weights(), before)
})

test_that("batch normalization on per-device shares is reported, with the fix in R", {
  skip_if_no_multigpu()
  data <- equivalence_data()
  model <- normalized_model()
  model$compile(optimizer = "sgd", loss = "sparse_categorical_crossentropy")
  report <- check_equivalence(model, data$x, data$classes, gpus = 4)
  expect_false(report$equal)
  # engine = "auto" (the default) runs the replicate engine on CPU devices.
  expect_identical(report$requested_engine, "auto")
  expect_identical(report$engine, "replicate")
  expect_match(report$engine_reason, "logical CPU devices")
  expect_output(print(report), 'engine = "auto" (the replicate engine)',
                fixed = TRUE)
  expect_named(report$differences,
               c("loss", "weights", "batchnorm_statistics", "optimizer_state"))
  expect_gt(report$differences[["batchnorm_statistics"]], 1e-3)
  expect_identical(report$first_difference, "loss")
  expect_match(report$cause, "BatchNormalization (\"norm\")", fixed = TRUE)
  expect_output(print(report), "loss differs first")
  expect_output(print(report), "sync_batchnorm = TRUE computes the statistics",
                fixed = TRUE)
  synced <- check_equivalence(model, data$x, data$classes, gpus = 4,
                              sync_batchnorm = TRUE)
  expect_true(synced$equal)
  expect_error(check_equivalence(model, data$x, data$classes, gpus = 4,
                                 sync_batchnorm = NA),
               class = "multigpu_value_error")
})

test_that("under a strategy, a loss that averages the rows itself is reported", {
  skip_if_no_multigpu()
  data <- equivalence_data()
  main <- reticulate::py_run_string(paste(
    "import keras",
    "def mean_of_squares(y_true, y_pred):",
    "    return keras.ops.mean(keras.ops.square(y_true - y_pred))",
    sep = "\n"), convert = FALSE)
  keras <- keras_py()
  model <- keras$Sequential(list(keras$Input(shape = list(4L)),
                                 keras$layers$Dense(8L, activation = "relu"),
                                 keras$layers$Dense(1L)))
  model$compile(optimizer = "sgd", loss = main$mean_of_squares)
  report <- check_equivalence(model, data$x, data$values, gpus = 4,
                              engine = "strategy", steps = 2)
  expect_false(report$equal)
  expect_identical(report$first_difference, "loss")
  expect_match(report$cause, "\"mean_of_squares\" returns one number", fixed = TRUE)
  expect_match(report$cause, 'reduction = "sum_over_batch_size"', fixed = TRUE)
})

test_that("check_equivalence() refuses bad arguments with R's words", {
  skip_if_no_multigpu()
  data <- equivalence_data(12L)
  model <- tiny_model()
  expect_error(check_equivalence(model, data$x, data$classes, gpus = 2),
               "is not compiled", class = "multigpu_value_error")
  model$compile(optimizer = "sgd", loss = "sparse_categorical_crossentropy")
  expect_error(check_equivalence(model, data$x, data$classes, gpus = 2, engine = "nccl"),
               'Invalid `engine`: received "nccl"', class = "multigpu_value_error")
  expect_error(check_equivalence(model, data$x, data$classes, gpus = 2, steps = NA),
               class = "multigpu_value_error")
  expect_error(check_equivalence(model, data$x, data$classes, gpus = 2, steps = 0),
               "Invalid `steps`", class = "multigpu_value_error")
  expect_error(check_equivalence(model, data$x, data$classes, gpus = 2, batch_size = 6),
               "steps need 18 rows", class = "multigpu_value_error")
  expect_error(check_equivalence(model, data$x, data$classes, gpus = 2, tolerance = -1),
               "Invalid `tolerance`", class = "multigpu_value_error")
  expect_error(check_equivalence("model", data$x, data$classes),
               "must be a Keras model", class = "multigpu_type_error")
})

# An adapted normalization, and a layer whose attribute was set after it was
# made (its config does not hold it).
preprocessed_models <- function(x) {
  main <- reticulate::py_run_string(paste(
    "import keras",
    "class Scale(keras.layers.Layer):",
    "    def __init__(self, **kwargs):",
    "        super().__init__(**kwargs)",
    "        self.scale = 1.0",
    "    def call(self, inputs):",
    "        return inputs * self.scale",
    sep = "\n"), convert = FALSE)
  keras <- keras_py()
  classifier <- function(middle) {
    input <- keras$Input(shape = list(4L))
    hidden <- keras$layers$Dense(8L, activation = "relu")(middle(input))
    keras$Model(input, keras$layers$Dense(3L, activation = "softmax")(hidden))
  }
  norm <- keras$layers$Normalization(name = "norm")
  norm$adapt(x * 3 + 5)
  scale <- main$Scale(name = "scaled")
  scaled <- classifier(scale)
  scale$scale <- 3
  list(normalized = classifier(norm), scaled = scaled)
}

test_that("an engine's copy that loses a layer's state is reported, not trusted", {
  skip_if_no_multigpu()
  data <- equivalence_data()
  models <- preprocessed_models(data$x)
  for (model in models) {
    model$compile(optimizer = "sgd", loss = "sparse_categorical_crossentropy")
  }
  x <- data$x * 3 + 5
  for (engine in c("auto", "replicate", "mirrored", "strategy")) {
    normalized <- check_equivalence(models$normalized, x, data$classes,
                                    gpus = 4, engine = engine, steps = 2)
    expect_true(normalized$equal)
  }
  expect_true(check_equivalence(models$scaled, x, data$classes, gpus = 4,
                                steps = 2)$equal)
  before <- models$scaled$get_weights()
  report <- check_equivalence(models$scaled, x, data$classes, gpus = 4,
                              engine = "mirrored", steps = 2)
  expect_false(report$equal)
  expect_identical(report$first_difference, "copy")
  expect_named(report$differences, "copy")
  expect_match(report$cause, "layer \"scaled\" (Scale) computes otherwise",
               fixed = TRUE)
  expect_match(report$cause, 'engine = "replicate"', fixed = TRUE)
  expect_output(print(report), "copy differs first")
  expect_equal(models$scaled$get_weights(), before)
})
