chain_model <- function() {
  keras <- keras_py()
  keras$Sequential(list(
    keras$Input(shape = list(4L)),
    keras$layers$Dense(8L, activation = "relu", name = "encode"),
    keras$layers$Dense(8L, activation = "relu", name = "transform"),
    keras$layers$Dense(3L, name = "score")
  ), name = "chain")
}

weights_device <- function(model, layer) {
  vapply(model$template$get_layer(layer)$weights,
         function(v) sub(".*/device:", "/device:", v$value$device), "")
}

test_that("model_parallel() puts each stage's weights on its device", {
  skip_if_no_multigpu()
  model <- chain_model()
  partitioned <- model_parallel(model, devices = 2, split = "transform")
  expect_s3_class(partitioned, "multigpu.partition.model_parallel.PartitionedModel")
  expect_identical(partitioned$devices, c("/device:CPU:0", "/device:CPU:1"))
  expect_identical(partitioned$stages, list("encode", c("transform", "score")))
  expect_identical(unique(weights_device(partitioned, "encode")), "/device:CPU:0")
  expect_identical(unique(weights_device(partitioned, "score")), "/device:CPU:1")
  x <- iris_x(1:10)
  expect_equal(predict(partitioned, x, verbose = 0),
               predict(model, x, verbose = 0), tolerance = 1e-5)
})

test_that("split accepts names, R positions and one vector per stage", {
  skip_if_no_multigpu()
  model <- chain_model()
  expected <- list("encode", c("transform", "score"))
  # model$layers of a Sequential model: encode, transform, score.
  expect_identical(model_parallel(model, devices = 2, split = 2)$stages, expected)
  expect_identical(model_parallel(model, split = list("encode", c("transform", "score")))$stages,
                   expected)
  auto <- model_parallel(model, devices = 3, microbatches = 2)
  expect_identical(auto$stages, list("encode", "transform", "score"))
  expect_identical(auto$microbatches, 2L)
})

test_that("training a partitioned model trains its template like the model", {
  skip_if_no_multigpu()
  model <- chain_model()
  reference <- keras_py()$models$clone_model(model)
  reference$set_weights(model$get_weights())
  partitioned <- model_parallel(model, devices = 3, microbatches = 2)
  for (m in list(partitioned, reference)) {
    compile(m, loss = "sparse_categorical_crossentropy",
            optimizer = keras_py()$optimizers$SGD(0.1))
  }
  fit(partitioned, iris_x(1:40), iris_y(1:40), batch_size = 20, epochs = 1,
      shuffle = FALSE, verbose = 0)
  fit(reference, iris_x(1:40), iris_y(1:40), batch_size = 20, epochs = 1,
      shuffle = FALSE, verbose = 0)
  expect_equal(partitioned$template$get_weights(), reference$get_weights(),
               tolerance = 1e-5)
  path <- withr::local_tempfile(fileext = ".h5")
  save_model_hdf5(partitioned, path)
  loaded <- load_model_hdf5(path)
  expect_false(inherits(loaded, "multigpu.partition.model_parallel.PartitionedModel"))
  # Saving keeps the trained weights exactly; the microbatched gradients
  # differ from the reference's by rounding (compared above at 1e-5).
  expect_identical(loaded$get_weights(), partitioned$template$get_weights())
})

test_that("model_parallel() errors name the argument and the fix", {
  skip_if_no_multigpu()
  model <- chain_model()
  expect_error(model_parallel(model, devices = 2, split = "nope"),
               'unknown layer name "nope"', class = "multigpu_value_error")
  expect_error(model_parallel(model, devices = 4),
               '4 stages (one per device) for "chain", which has only 3 layer(s)',
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(model_parallel(model, devices = c("/cpu:0", "/cpu:9")),
               'Unknown device(s) list("/cpu:9")', fixed = TRUE,
               class = "multigpu_value_error")
  expect_error(model_parallel(model, split = c("transform", NA)),
               "`split` contains NA", class = "multigpu_value_error")
  expect_error(model_parallel(model, split = 0), "`split` is not a position >= 1",
               class = "multigpu_value_error")
  expect_error(model_parallel(model, split = TRUE), "`split` must be layer names",
               class = "multigpu_type_error")
  expect_error(model_parallel(model, devices = 2, microbatches = 0),
               "Invalid `microbatches`: received 0", class = "multigpu_value_error")
  expect_error(model_parallel("model"), "`model` must be a Keras model",
               class = "multigpu_type_error")
})
