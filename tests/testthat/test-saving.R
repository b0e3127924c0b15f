trained_parallel <- function() {
  model <- tiny_model()
  parallel <- multi_gpu_model(model, gpus = 2)
  parallel |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  parallel |> fit(iris_x(), iris_y(), epochs = 1, verbose = 0)
  list(model = model, parallel = parallel)
}

test_that("save_model_hdf5() of a parallel model writes the template, which loads without multigpu", {
  skip_if_no_multigpu()
  trained <- trained_parallel()
  file <- tempfile(fileext = ".h5")
  expect_invisible(result <- trained$parallel %>% save_model_hdf5(file))
  expect_identical(result, trained$parallel)
  loaded <- load_model_hdf5(file)
  expect_false(inherits(loaded, "multigpu.engines.tensorflow.replicate.ParallelModel"))
  expect_identical(loaded$name, trained$model$name)
  expect_equal(predict(loaded, iris_x(1:5), verbose = 0),
               predict(trained$parallel, iris_x(1:5), verbose = 0), tolerance = 1e-6)
  # The file is plain Keras: h5py sees a model config without multigpu classes.
  config <- reticulate::import("h5py")$File(file, "r")$attrs$get("model_config")
  expect_false(grepl("ParallelModel|DataParallel", config))
})

test_that("load_model_hdf5() loads loss = \"mse\" compiled, with the optimizer state", {
  # Keras 3.15 alone refuses to compile a legacy .h5 whose loss is "mse".
  skip_if_no_multigpu()
  model <- tiny_model(outputs = 1L, activation = "linear")
  parallel <- multi_gpu_model(model, gpus = 2)
  parallel |> compile(optimizer = "adam", loss = "mse", metrics = "mae")
  y <- as.numeric(iris$Petal.Width)
  parallel |> fit(iris_x(), y, epochs = 2, batch_size = 50, verbose = 0)
  file <- tempfile(fileext = ".h5")
  model %>% save_model_hdf5(file)
  loaded <- load_model_hdf5(file)
  expect_true(loaded$compiled)
  expect_identical(as.integer(loaded$optimizer$iterations$numpy()), 6L)
  expect_equal(evaluate(loaded, iris_x(), y, verbose = 0),
               evaluate(parallel, iris_x(), y, verbose = 0), tolerance = 1e-6)
})

test_that("saving the template (as the original docs say) gives the same model", {
  skip_if_no_multigpu()
  trained <- trained_parallel()
  file <- tempfile(fileext = ".hdf5")
  trained$model |> save_model_hdf5(file, include_optimizer = FALSE)
  loaded <- load_model_hdf5(file, compile = FALSE)
  expect_equal(predict(loaded, iris_x(1:5), verbose = 0),
               predict(trained$parallel, iris_x(1:5), verbose = 0), tolerance = 1e-6)
  again <- multi_gpu_model(loaded, gpus = 2)
  expect_equal(predict(again, iris_x(1:5), verbose = 0),
               predict(trained$model, iris_x(1:5), verbose = 0), tolerance = 1e-6)
})

test_that("weights saved from a parallel model load into the template and back", {
  skip_if_no_multigpu()
  trained <- trained_parallel()
  file <- tempfile(fileext = ".weights.h5")
  trained$parallel %>% save_model_weights_hdf5(file)
  fresh <- tiny_model()
  expect_invisible(result <- fresh %>% load_model_weights_hdf5(file))
  expect_identical(result, fresh)
  expect_equal(predict(fresh, iris_x(1:5), verbose = 0),
               predict(trained$model, iris_x(1:5), verbose = 0), tolerance = 1e-6)
  other <- multi_gpu_model(tiny_model(), gpus = 3)
  other %>% load_model_weights_hdf5(file)
  expect_equal(predict(other, iris_x(1:5), verbose = 0),
               predict(trained$model, iris_x(1:5), verbose = 0), tolerance = 1e-6)
})

test_that("paths are checked in R: extension, overwrite, NA", {
  skip_if_no_multigpu()
  model <- tiny_model()
  expect_error(save_model_hdf5(model, file.path(tempdir(), "model.keras")),
               "`filepath` must end in \".h5\" or \".hdf5\", not \".*model.keras\". Use e.g. filepath = \"model.h5\"",
               class = "multigpu_value_error")
  expect_error(save_model_weights_hdf5(model, file.path(tempdir(), "my_weights.h5")),
               "`filepath` must end in \".weights.h5\", .* Use e.g. filepath = \"my_weights.weights.h5\"",
               class = "multigpu_value_error")
  expect_error(save_model_hdf5(model, NA_character_), "`filepath` must be a single non-empty path",
               class = "multigpu_value_error")
  file <- tempfile(fileext = ".h5")
  save_model_hdf5(model, file)
  expect_error(save_model_hdf5(model, file, overwrite = FALSE),
               "`filepath` already exists: .* Use overwrite = TRUE to replace it",
               class = "multigpu_os_error")
  expect_error(save_model_hdf5(model, file, overwrite = NA), "`overwrite` must be TRUE or FALSE, not NA",
               class = "multigpu_value_error")
  expect_silent(save_model_hdf5(model, file, overwrite = TRUE))
  expect_error(save_model_hdf5(iris, file), "`object` must be a Keras model, not a data frame",
               class = "multigpu_type_error")
  expect_error(load_model_weights_hdf5("model", file), "`object` must be a Keras model",
               class = "multigpu_type_error")
})

test_that("loading a missing file is an error carrying Keras's message", {
  skip_if_no_multigpu()
  missing <- file.path(tempdir(), "missing.h5")
  error <- tryCatch(load_model_hdf5(missing), error = identity)
  expect_s3_class(error, "multigpu_python_error")
  expect_match(conditionMessage(error), "missing.h5", fixed = TRUE)
  expect_error(load_model_weights_hdf5(tiny_model(), file.path(tempdir(), "missing.weights.h5")),
               "missing.weights.h5", class = "multigpu_python_error")
})

test_that("save_model_hdf5() writes files Keras's own load_model compiles, aliases and all", {
  # Keras 3.15 writes loss = "mse" into .h5 files it then cannot compile.
  skip_if_no_multigpu()
  model <- tiny_model(outputs = 1L, activation = "linear")
  model |> compile(optimizer = "adam", loss = "mse", metrics = c("mae", "mse"))
  y <- as.numeric(iris$Petal.Width)
  model |> fit(iris_x(), y, epochs = 1, batch_size = 50, verbose = 0)
  file <- tempfile(fileext = ".h5")
  model %>% save_model_hdf5(file)
  loaded <- keras_py()$models$load_model(file)
  expect_true(loaded$compiled)
  expect_identical(as.integer(loaded$optimizer$iterations$numpy()), 3L)
  expect_equal(evaluate(loaded, iris_x(), y, verbose = 0),
               evaluate(model, iris_x(), y, verbose = 0), tolerance = 1e-6)
})

test_that("load_model_hdf5() names a file that is no model instead of calling it missing", {
  skip_if_no_multigpu()
  file <- tempfile(fileext = ".h5")
  writeLines("garbage", file)
  expect_error(load_model_hdf5(file), "is not a Keras model file",
               class = "multigpu_value_error")
  error <- tryCatch(load_model_hdf5(file), error = identity)
  expect_match(conditionMessage(error), sprintf('"%s"', file), fixed = TRUE)
})
