test_that("compile() accepts one metric name, returns the model invisibly, and pipes", {
  skip_if_no_multigpu()
  parallel <- multi_gpu_model(tiny_model(), gpus = 2)
  expect_invisible(result <- parallel %>% compile(loss = "sparse_categorical_crossentropy",
                                                  metrics = "accuracy"))
  expect_identical(result, parallel)
  history <- parallel |> fit(iris_x(), iris_y(), epochs = 1, verbose = 0)
  expect_named(history$metrics, c("accuracy", "loss"), ignore.order = TRUE)
  expect_error(parallel |> compile(loss = "mse", steps_per_execution = 1.5),
               "`steps_per_execution` is not a whole number", class = "multigpu_value_error")
  expect_error(parallel |> compile(loss = "mse", jit_compile = NA),
               "`jit_compile` must be TRUE or FALSE, not NA", class = "multigpu_value_error")
  # Keras resolves the loss when training starts; its error reaches R.
  parallel |> compile(loss = "no_such_loss")
  expect_error(parallel |> fit(iris_x(), iris_y(), verbose = 0), "no_such_loss",
               class = "multigpu_python_error")
})

test_that("fit() coerces R arguments and returns the history invisibly", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()
  # epochs and batch_size as doubles, y as a factor, verbose as FALSE.
  expect_invisible(history <- parallel |>
    fit(iris_x(), iris_y(), epochs = 3, batch_size = 50, verbose = FALSE))
  expect_s3_class(history, c("multigpu_training_history", "keras_training_history"))
  expect_identical(history$epochs, 1:3)
  expect_identical(history$params$epochs, 3L)
  expect_identical(history$params$steps, 3L)
  expect_length(history$metrics$loss, 3L)
  expect_type(history$metrics$accuracy, "double")
})

test_that("fit() rejects non-counts, non-fractions and NA flags in R", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()
  expect_error(fit(parallel, iris_x(), iris_y(), epochs = 2.5, verbose = 0),
               "`epochs` is not a whole number: received 2.5", class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), epochs = NA, verbose = 0),
               "`epochs` contains NA", class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), batch_size = -32, verbose = 0),
               "`batch_size` is negative", class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), verbose = "chatty"),
               "`verbose` must be \"auto\", 0", class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), validation_split = 1.5, verbose = 0),
               "`validation_split` must be a fraction in [0, 1), not 1.5", fixed = TRUE,
               class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), validation_split = NA, verbose = 0),
               "`validation_split` must be a fraction", class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), shuffle = NA, verbose = 0),
               "`shuffle` must be TRUE or FALSE, not NA", class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), initial_epoch = 0, verbose = 0),
               "`initial_epoch` counts from 1 (the first epoch), as in keras3: received 0",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), steps_per_epoch = 0.5, verbose = 0),
               "`steps_per_epoch` is not a whole number", class = "multigpu_value_error")
  expect_error(fit(parallel, iris_x(), iris_y(), class_weight = c(1, 2, 3), verbose = 0),
               "`class_weight` must be named by 0-based class index", class = "multigpu_value_error")
  # Errors Keras raises come back with its message.
  expect_error(fit(parallel, iris_x(), iris_y()[1:10], verbose = 0),
               class = "multigpu_value_error")
})

test_that("initial_epoch is 1-based: resuming at epoch 2 of 3 trains epochs 2 and 3", {
  skip_if_no_multigpu()
  history <- compiled_parallel() |>
    fit(iris_x(), iris_y(), epochs = 3, initial_epoch = 2, verbose = 0)
  expect_identical(history$epochs, 2:3)
  expect_length(history$metrics$loss, 2L)
})

test_that("validation data, class weights, sample weights and a single callback are converted", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()
  epochs_seen <- integer()
  callback <- keras_py()$callbacks$LambdaCallback(
    on_epoch_end = function(epoch, logs) epochs_seen <<- c(epochs_seen, epoch)
  )
  history <- parallel |> fit(
    iris_x(), iris_y(), epochs = 2, verbose = 0,
    validation_data = list(iris_x(1:30), iris_y(1:30)),
    class_weight = c("0" = 1, "1" = 2, "2" = 1),
    callbacks = callback
  )
  expect_named(history$metrics, c("accuracy", "loss", "val_accuracy", "val_loss"),
               ignore.order = TRUE)
  expect_identical(as.integer(epochs_seen), 0:1)
  history <- parallel |> fit(iris_x(), iris_y(), epochs = 1, verbose = 0,
                             validation_split = 0.2, sample_weight = rep(1, 150))
  expect_true("val_loss" %in% names(history$metrics))
  # Sample weights of zero for all but one class: only that class counts.
  weights <- as.numeric(iris_y() == "setosa")
  weighted <- parallel |> evaluate(iris_x(), iris_y(), sample_weight = weights, verbose = 0)
  setosa <- parallel |> evaluate(iris_x(1:50), iris_y(1:50), verbose = 0)
  expect_equal(weighted$loss * 3, setosa$loss, tolerance = 1e-4)
})

test_that("fit() output lands in knitr documents, one line per epoch", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()
  withr::local_options(knitr.in.progress = TRUE)
  output <- capture.output(parallel |> fit(iris_x(), iris_y(), epochs = 2, batch_size = 75))
  expect_length(grep("^Epoch [12]/2$", output), 2L)
  expect_length(grep("^2/2 - .* - loss: [0-9.]+$|^2/2 - .*loss: ", output), 2L)
})

test_that("evaluate() returns a named list and predict() an R array, as Keras computes them", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel(gpus = 4)
  parallel |> fit(iris_x(), iris_y(), epochs = 1, verbose = 0)
  scores <- parallel |> evaluate(iris_x(), iris_y(), verbose = 0)
  expect_type(scores, "list")
  expect_named(scores, c("accuracy", "loss"), ignore.order = TRUE)
  x32 <- reticulate::np_array(iris_x(), dtype = "float32")
  y <- reticulate::np_array(as.integer(iris_y()) - 1L)
  direct <- parallel$evaluate(x32, y, verbose = 0L, return_dict = TRUE)
  expect_equal(scores$loss, direct$loss, tolerance = 1e-6)
  expect_identical(evaluate(parallel, iris_x(), y = iris_y(), verbose = 0), scores)
  if (nzchar(system.file(package = "tensorflow"))) {
    # tensorflow's generic, as keras3 users call it: the inputs named x.
    expect_identical(evaluate(parallel, x = iris_x(), y = iris_y(), verbose = 0), scores)
  }

  predictions <- parallel |> predict(iris_x(1:7), verbose = 0)
  expect_true(is.matrix(predictions))
  expect_identical(dim(predictions), c(7L, 3L))
  expect_equal(rowSums(predictions), rep(1, 7), tolerance = 1e-5)
  expect_equal(predictions, parallel$predict(x32, verbose = 0L)[1:7, ], tolerance = 1e-6)
  expect_error(predict(parallel, iris_x(), batch_size = 0.5, verbose = 0),
               "`batch_size` is not a whole number", class = "multigpu_value_error")
  expect_error(evaluate(parallel, iris_x(), iris_y(), steps = -1, verbose = 0),
               "`steps` is negative", class = "multigpu_value_error")
})

test_that("fit() stops at a batch holding NA or Inf, naming it the R way", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()
  expect_true(parallel$check_finite)  # on by default
  x <- iris_x()
  x[60, 2] <- NA  # epoch 1, batch 2 of 50 rows, row 9 (0-based) of it
  expect_error(
    fit(parallel, x, iris_y(), batch_size = 50, shuffle = FALSE, verbose = 0),
    paste0("Non-finite training data in epoch 1, batch 2 (counted from 1): ",
           "x has 1 NaN value in 1 row (row 9 of the batch"),
    fixed = TRUE, class = "multigpu_value_error")
  weights <- parallel$get_weights()
  expect_true(all(vapply(weights, function(w) all(is.finite(w)), NA)))
  # The message says how to train without the check, in R.
  parallel$check_finite <- FALSE
  x[60, 2] <- Inf
  fit(parallel, x, iris_y(), batch_size = 50, shuffle = FALSE, verbose = 0)
  expect_false(all(vapply(parallel$get_weights(),
                          function(w) all(is.finite(w)), NA)))
})
