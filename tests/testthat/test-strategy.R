scoped_model <- function(strategy, outputs = 2L) {
  with(strategy$scope(), {
    model <- tiny_model(outputs = outputs, activation = NULL)
    model |> compile(optimizer = "adam",
                     loss = keras_py()$losses$SparseCategoricalCrossentropy(from_logits = TRUE),
                     metrics = "sparse_categorical_accuracy")
  })
  model
}

binary_data <- function(rows = 200) {
  x <- matrix(stats::runif(rows * 4), ncol = 4)
  list(x = x, y = as.integer(rowSums(x) > 2))
}

test_that("mirrored_strategy() reads devices like gpus and reuses strategies", {
  skip_if_no_multigpu()
  strategy <- mirrored_strategy()
  expect_s3_class(strategy, "tensorflow.python.distribute.mirrored_strategy.MirroredStrategy")
  expect_identical(strategy$num_replicas_in_sync, 4L)
  expect_identical(mirrored_strategy(2)$num_replicas_in_sync, 2L)
  expect_identical(unlist(mirrored_strategy(c("/cpu:1", "/cpu:3"))$extended$worker_devices),
                   c("/job:localhost/replica:0/task:0/device:CPU:1",
                     "/job:localhost/replica:0/task:0/device:CPU:3"))
  expect_true(reticulate::py_id(mirrored_strategy(3)) == reticulate::py_id(mirrored_strategy(3L)))
  expect_identical(mirrored_strategy(cross_device_ops = "reduce_to_one")$num_replicas_in_sync, 4L)
})

test_that("mirrored_strategy() errors: NA in R, the rest from Python", {
  skip_if_no_multigpu()
  expect_error(mirrored_strategy(NA), "`devices` must not be NA", class = "multigpu_value_error")
  expect_error(mirrored_strategy(c(1, NaN)), "`devices` contains NA or NaN", class = "multigpu_value_error")
  expect_error(mirrored_strategy(-4), "`devices` is negative", class = "multigpu_value_error")
  expect_error(mirrored_strategy(c(0, 1)), "GPU ids were given but this machine has no GPU",
               class = "multigpu_value_error")
  expect_error(mirrored_strategy(cross_device_ops = "bogus"), 'Invalid `cross_device_ops`: received "bogus"',
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(mirrored_strategy(cross_device_ops = 5), "Invalid `cross_device_ops`: received an object of type float",
               fixed = TRUE, class = "multigpu_type_error")
})

test_that("with(strategy$scope(), ...) builds a mirrored model that fit(), evaluate() and predict() train and use", {
  skip_if_no_multigpu()
  strategy <- mirrored_strategy()
  data <- binary_data()
  with(strategy$scope(), {
    model <- tiny_model(outputs = 2L, activation = "softmax")
    model |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy",
                     metrics = "accuracy")
  })
  expect_s3_class(model$weights[[1]]$value, "tensorflow.python.distribute.values.MirroredVariable")
  dataset <- distributed_dataset(data$x, data$y, per_replica_batch_size = 10,
                                 strategy = strategy)
  history <- model |> fit(dataset, epochs = 2, verbose = 0)
  expect_identical(history$epochs, 1:2)
  expect_identical(history$params$steps, 5L)
  scores <- model |> evaluate(dataset, verbose = 0)
  expect_named(scores, c("accuracy", "loss"), ignore.order = TRUE)
  expect_identical(dim(predict(model, data$x[1:9, ], verbose = 0)), c(9L, 2L))
})

test_that("fit_distributed() trains with strategy$run() and returns an R history", {
  skip_if_no_multigpu()
  strategy <- mirrored_strategy(2)
  with(strategy$scope(), {
    model <- tiny_model(outputs = 2L)
    model |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  })
  data <- binary_data()
  dataset <- distributed_dataset(data$x, data$y, per_replica_batch_size = 20,
                                 strategy = strategy)
  expect_invisible(history <- model |> fit_distributed(dataset, epochs = 2, verbose = 0))
  expect_s3_class(history, "multigpu_training_history")
  expect_identical(history$epochs, 1:2)
  history <- model |> fit_distributed(dataset, epochs = 3, initial_epoch = 3, verbose = 0)
  expect_identical(history$epochs, 3L)
  expect_error(fit_distributed(model, dataset, epochs = 1.5), "`epochs` is not a whole number",
               class = "multigpu_value_error")
  expect_error(fit_distributed(iris, dataset), "`object` must be a Keras model",
               class = "multigpu_type_error")
  uncompiled <- tiny_model()
  expect_error(fit_distributed(uncompiled, dataset, verbose = 0), class = "multigpu_python_error")
})

test_that("multi_gpu_model(engine = 'mirrored') trains a mirrored copy and keeps the template's weights", {
  skip_if_no_multigpu()
  model <- tiny_model()
  parallel <- multi_gpu_model(model, gpus = 2, engine = "mirrored")
  expect_s3_class(parallel, "multigpu.mirrored.MirroredModel")
  parallel |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  parallel |> fit(iris_x(), iris_y(), epochs = 1, batch_size = 50, verbose = 0)
  expect_equal(predict(parallel, iris_x(1:5), verbose = 0),
               predict(model, iris_x(1:5), verbose = 0), tolerance = 1e-5)
  expect_error(multi_gpu_model(model, engine = "bogus"), "engine", class = "multigpu_value_error")
})
