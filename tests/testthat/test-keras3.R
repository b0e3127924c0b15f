# multigpu as keras3 users meet it: keras3 and tfdatasets attached in either
# order with multigpu, keras3's objects passed to every function that takes
# a model, layer, optimizer, loss, metric, callback or dataset, and keras3's
# own compile()/fit()/evaluate()/predict() methods. Loading keras3 changes
# S3 dispatch for the whole R process (its methods come first for every
# Keras model), so each order runs in a fresh R session of its own.

skip_if_no_keras3 <- function() {
  skip_if_not_installed_unloaded("keras3")
  skip_if_not_installed_unloaded("tfdatasets")
}

attach_in_order <- function(order) {
  packages <- switch(order,
    keras3_first = c("keras3", "tfdatasets", "multigpu"),
    multigpu_first = c("multigpu", "keras3", "tfdatasets"))
  c("attach_messages <- character()",
    "withCallingHandlers({",
    # As keras3's guides attach it: tfdatasets' shape() would mask keras3's.
    sprintf("  library(%s)", sub("^tfdatasets$", "tfdatasets, exclude = 'shape'", packages)),
    "}, packageStartupMessage = function(m) {",
    "  attach_messages <<- c(attach_messages, conditionMessage(m))",
    "  invokeRestart('muffleMessage')",
    "}, message = function(m) {",
    "  attach_messages <<- c(attach_messages, conditionMessage(m))",
    "  invokeRestart('muffleMessage')",
    "})")
}

# Lines "name: value" of a run_r() output, as a named character vector.
reported <- function(output) {
  lines <- grep("^[a-z_0-9]+: ", output, value = TRUE)
  stats::setNames(sub("^[a-z_0-9]+: ", "", lines), sub(": .*$", "", lines))
}

for (order in c("keras3_first", "multigpu_first")) local({
  order <- order

  test_that(sprintf("attaching %s prints no masking message; one evaluate()", order), {
    skip_if_no_keras3()
    output <- run_r(c(
      attach_in_order(order),
      "cat('messages:', length(attach_messages), '\\n')",
      "writeLines(paste('message_text:', attach_messages))",
      "cat('same_evaluate:', identical(multigpu::evaluate, keras3::evaluate), '\\n')",
      "cat('python_started:', reticulate::py_available(), '\\n')"
    ))
    expect_identical(attr(output, "status"), 0L, info = paste(output, collapse = "\n"))
    values <- reported(output)
    expect_identical(values[["messages"]], "0 ", info = paste(output, collapse = "\n"))
    expect_identical(values[["same_evaluate"]], "TRUE ")
    expect_identical(values[["python_started"]], "FALSE ")
  })

  test_that(sprintf("%s: a keras3 model through multi_gpu_model() steps as its template", order), {
    skip_if_no_keras3()
    skip_if_no_multigpu()
    output <- run_r(c(
      attach_in_order(order),
      "virtual_devices(2)",
      "set_random_seed(7)",
      "build <- function() keras_model_sequential(input_shape = 4) |>",
      "  layer_dense(8, activation = 'relu') |>",
      "  layer_dense(3, activation = 'softmax')",
      "template <- build()",
      "reference <- build()",
      "reference |> set_weights(get_weights(template))",
      "before <- get_weights(template)",
      "parallel <- suppressWarnings(template |> multi_gpu_model(gpus = 2))",
      "x <- unname(as.matrix(iris[1:32, 1:4])); y <- as.integer(iris$Species[1:32]) - 1L",
      "for (model in list(parallel, reference)) {",
      "  model |> compile(optimizer = optimizer_sgd(learning_rate = 0.1),",
      "                   loss = loss_sparse_categorical_crossentropy(),",
      "                   metrics = list(metric_sparse_categorical_accuracy()))",
      "}",
      "history <- parallel |> fit(x, y, batch_size = 32, epochs = 1, shuffle = FALSE, verbose = 0)",
      "reference |> fit(x, y, batch_size = 32, epochs = 1, shuffle = FALSE, verbose = 0)",
      "largest <- function(a, b) max(mapply(function(u, v) max(abs(u - v)), a, b))",
      "cat('step_size:', largest(get_weights(template), before), '\\n')",
      "cat('sgd_difference:', largest(get_weights(template), get_weights(reference)), '\\n')",
      "dataset <- tensor_slices_dataset(list(x, y)) |> dataset_batch(16)",
      "parallel |> fit(dataset, epochs = 1, verbose = 0)",
      "reference |> fit(dataset, epochs = 1, verbose = 0)",
      "cat('dataset_difference:', largest(get_weights(template), get_weights(reference)), '\\n')",
      "scores <- parallel |> evaluate(x, y, verbose = 0)",
      "cat('history_class:', class(history)[[1]], '\\n')",
      "cat('evaluate_names:', paste(names(scores), collapse = ','), '\\n')",
      "cat('evaluate_numeric:', is.numeric(unlist(scores)), '\\n')",
      "predictions <- parallel |> predict(x, verbose = 0)",
      "cat('predict_dim:', paste(dim(predictions), collapse = 'x'), '\\n')"
    ))
    expect_identical(attr(output, "status"), 0L, info = paste(output, collapse = "\n"))
    values <- reported(output)
    expect_gt(as.numeric(values[["step_size"]]), 1e-4)
    expect_lt(as.numeric(values[["sgd_difference"]]), 1e-5)
    expect_lt(as.numeric(values[["dataset_difference"]]), 1e-5)
    expect_identical(values[["history_class"]], "keras_training_history ")
    expect_identical(values[["evaluate_names"]], "loss,sparse_categorical_accuracy ")
    expect_identical(values[["evaluate_numeric"]], "TRUE ")
    expect_identical(values[["predict_dim"]], "32x3 ")
  })
})

test_that("keras3 objects go into every function that takes a model, layer, optimizer, loss, metric, callback or dataset", {
  skip_if_no_keras3()
  skip_if_no_multigpu()
  output <- run_r(c(
    attach_in_order("keras3_first"),
    "virtual_devices(2)",
    "set_random_seed(3)",
    "x <- matrix(runif(64 * 4), ncol = 4); y <- as.integer(x[, 1] > 0.5)",
    "build_model <- function() {",
    "  inputs <- keras_input(shape = 4, name = 'features')",
    "  outputs <- inputs |> layer_dense(8, activation = 'relu') |>",
    "    layer_dense(2, activation = 'softmax')",
    "  model <- keras_model(inputs, outputs)",
    "  model |> compile(optimizer = optimizer_adam(learning_rate = 0.01),",
    "                   loss = loss_sparse_categorical_crossentropy(),",
    "                   metrics = list(metric_sparse_categorical_accuracy()))",
    "  model",
    "}",
    "# A mirrored strategy's scope, with keras3 objects made inside it.",
    "strategy <- mirrored_strategy(2)",
    "with(strategy$scope(), model <- build_model())",
    "data <- distributed_dataset(tensor_slices_dataset(list(x, y)),",
    "                            per_replica_batch_size = 8, strategy = strategy)",
    "stopper <- callback_early_stopping(monitor = 'loss', patience = 5)",
    "history <- model |> fit_distributed(data, epochs = 2, strategy = strategy,",
    "                                    callbacks = list(stopper), verbose = 0)",
    "cat('fit_distributed_epochs:', length(history$metrics$loss), '\\n')",
    "# keras3's fit() with multigpu's checkpoints next to a keras3 callback.",
    "dir <- file.path(tempdir(), 'ckpt')",
    "with(strategy$scope(), restored <- make_or_restore_model(dir, build_model))",
    "restored |> fit(tensor_slices_dataset(list(x, y)) |> dataset_batch(16), epochs = 2, verbose = 0,",
    "                callbacks = c(checkpoint_callbacks(dir), list(callback_terminate_on_nan())))",
    "with(strategy$scope(), again <- make_or_restore_model(dir, build_model))",
    "cat('checkpoints:', length(list.files(dir, 'ckpt-.*[.]keras')), '\\n')",
    "cat('restored_same:', isTRUE(all.equal(get_weights(again), get_weights(restored))), '\\n')",
    "# Model parallelism and the placement report of keras3 models.",
    "sequential <- keras_model_sequential(input_shape = 4) |> layer_dense(8) |>",
    "  layer_dense(8) |> layer_dense(2)",
    "staged <- model_parallel(sequential, devices = 2)",
    "staged |> compile(optimizer = optimizer_sgd(), loss = loss_mean_squared_error())",
    "staged |> fit(x, matrix(0, 64, 2), epochs = 1, verbose = 0)",
    "cat('model_parallel_predict:', paste(dim(predict(staged, x, verbose = 0)), collapse = 'x'), '\\n')",
    "parallel <- suppressWarnings(multi_gpu_model(build_model(), gpus = 2))",
    "parallel |> compile(optimizer = optimizer_adam(), loss = loss_sparse_categorical_crossentropy())",
    "report <- placement_report(parallel, x[1:8, ], y[1:8], print_table = FALSE)",
    "cat('placement_class:', class(report)[[1]], '\\n')",
    "# Saving keras3 models, read back by keras3.",
    "file <- file.path(tempdir(), 'model.h5')",
    "template <- build_model()",
    "save_model_hdf5(template, file)",
    "loaded <- load_model(file)",
    "cat('hdf5_same:', isTRUE(all.equal(get_weights(loaded), get_weights(template))), '\\n')"
  ))
  expect_identical(attr(output, "status"), 0L, info = paste(output, collapse = "\n"))
  values <- reported(output)
  expect_identical(values[["fit_distributed_epochs"]], "2 ")
  expect_identical(values[["checkpoints"]], "2 ")
  expect_identical(values[["restored_same"]], "TRUE ")
  expect_identical(values[["model_parallel_predict"]], "64x2 ")
  expect_identical(values[["placement_class"]], "multigpu_placement_report ")
  expect_identical(values[["hdf5_same"]], "TRUE ")
})

# The seed guide made runnable (vignettes/multi-device-guide.Rmd) is written
# with keras3 attached first; R CMD build and check run it that way. Here it
# runs with multigpu attached first, as code of the same steps in the other
# order: it trains, evaluates, checkpoints, resumes, and ends in
# multi_gpu_model().
guide_code <- function() {
  purled <- system.file("doc", "multi-device-guide.R", package = "multigpu")
  if (nzchar(purled)) return(readLines(purled))
  # The source tree's vignette, or under R CMD check (which builds no
  # vignettes here: make docs knits them) the unpacked tarball's, beside
  # the tests' directory.
  sources <- c(test_path("..", "..", "vignettes", "multi-device-guide.Rmd"),
               test_path("..", "..", "00_pkg_src", "multigpu", "vignettes",
                         "multi-device-guide.Rmd"))
  source <- Find(file.exists, sources)
  if (is.null(source)) return(NULL)
  output <- tempfile(fileext = ".R")
  knitr::purl(source, output = output, quiet = TRUE, documentation = 0L)
  readLines(output)
}

test_that("the seed guide runs with multigpu attached before keras3", {
  # The docs step knits the guide itself (vignettes/multi-device-guide.Rmd,
  # keras3 attached first) in both tiers.
  skip_unless_full_tier("the seed guide again, in a child R process, multigpu attached first")
  skip_if_no_keras3()
  skip_if_no_multigpu()
  code <- guide_code()
  if (is.null(code)) skip("the vignette's source is not in this installation")
  attach_lines <- which(code %in% c("library(keras3)", "library(multigpu)"))
  expect_length(attach_lines, 2L)
  code[attach_lines] <- c("library(multigpu)", "library(keras3)")
  output <- run_r(c(code, "cat('guide: done\\n')"))
  expect_identical(attr(output, "status"), 0L, info = paste(tail(output, 40), collapse = "\n"))
  expect_true("guide: done" %in% output)
})
