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
  expect_s3_class(strategy, "multigpu.distribute.strategy.ExplainingMirroredStrategy")
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
  # In R spelling (it read "expected None, one of ['hierarchical_copy', ...]").
  expect_error(mirrored_strategy(cross_device_ops = 5),
               'Invalid `cross_device_ops`: received 5; expected NULL (collective all-reduce), one of "hierarchical_copy", "nccl", or "reduce_to_one"',
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
  expect_length(history$metrics$loss, 2L)
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
  expect_s3_class(parallel, "multigpu.engines.tensorflow.mirrored.MirroredModel")
  parallel |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  parallel |> fit(iris_x(), iris_y(), epochs = 1, batch_size = 50, verbose = 0)
  expect_equal(predict(parallel, iris_x(1:5), verbose = 0),
               predict(model, iris_x(1:5), verbose = 0), tolerance = 1e-5)
  expect_error(multi_gpu_model(model, engine = "bogus"), "engine", class = "multigpu_value_error")
})

# Multi-worker training from R: the same script (workers/train.R) on 2
# workers, started by Slurm's srun or by multigpu's launcher.

# Trains workers/train.R on 2 workers through `start` (a function of the
# Rscript command line returning the output); checks both workers against
# one process training on the same global batches.
expect_two_workers_train_like_one_process <- function(start) {
  out <- withr::local_tempdir()
  set.seed(3)
  x <- matrix(stats::runif(96 * 4), ncol = 4)
  data <- list(x = x, y = matrix(rowSums(x), ncol = 1), epochs = 3L)
  data_file <- file.path(out, "data.rds")
  saveRDS(data, data_file)
  rscript <- c(file.path(R.home("bin"), "Rscript"), "--vanilla",
               test_path("workers", "train.R"), data_file, out)
  output <- start(rscript)
  expect_identical(attr(output, "status"), 0L,
                   info = paste(output, collapse = "\n"))
  expect_true(all(c("worker 0 done", "worker 1 done") %in% trimws(
    sub("^\\[worker [0-9]+\\] ", "", output))), info = paste(output, collapse = "\n"))
  workers <- lapply(0:1, function(i) readRDS(file.path(out, sprintf("worker-%d.rds", i))))
  expect_identical(workers[[1]]$replicas, 2L)
  expect_identical(workers[[2]]$replicas, 2L)
  expect_identical(workers[[1]]$weights, workers[[2]]$weights)

  reference <- one_process_fit(workers[[1]]$initial, data, batch_size = 16)
  expect_equal(workers[[1]]$loss, reference$loss, tolerance = 1e-5)
  expect_equal(workers[[1]]$weights, reference$weights, tolerance = 1e-5)
}

test_that("srun -n2 Rscript: multi_worker_strategy() joins the Slurm step and fit_distributed() trains like one process", {
  skip_if_no_multigpu()
  skip_if_no_slurm()
  expect_two_workers_train_like_one_process(function(rscript) {
    run_command("srun", c("-n2", "--kill-on-bad-exit=1", "--time=5",
                          shQuote(rscript)))
  })
})

test_that("srun -n2 Rscript, written with keras3 attached first, trains like one process", {
  # The gate runs srun -n2 Rscript above, and keras3 attached first in
  # test-keras3.R.
  skip_unless_full_tier("a second Slurm step of R workers, keras3 attached first")
  skip_if_not_installed_unloaded("keras3")
  skip_if_no_multigpu()
  skip_if_no_slurm()
  withr::local_envvar(MULTIGPU_WORKER_KERAS3 = "true")
  expect_two_workers_train_like_one_process(function(rscript) {
    run_command("srun", c("-n2", "--kill-on-bad-exit=1", "--time=5",
                          shQuote(rscript)))
  })
})

test_that("python -m multigpu.launch --workers 2 -- Rscript train.R trains like one process", {
  # The gate starts R workers with the launcher on JAX (test-jax.R) and
  # with srun on TensorFlow (above).
  skip_unless_full_tier("the launcher's R workers on TensorFlow too")
  skip_if_no_multigpu()
  python <- multigpu_config()$python
  expect_two_workers_train_like_one_process(function(rscript) {
    run_command(python, c("-m", "multigpu.launch", "--workers", "2",
                          "--timeout", "300", "--", shQuote(rscript)))
  })
})

test_that("the launcher stops R workers at once when one fails", {
  # The launcher's stop is the core's: test_launch.py runs it in the gate.
  skip_unless_full_tier("the launcher's stop, with R workers")
  skip_if_no_multigpu()
  script <- withr::local_tempfile(fileext = ".R")
  writeLines(c(
    "index <- jsonlite::fromJSON(Sys.getenv('TF_CONFIG'))$task$index",
    "if (index == 1) { cat('R worker 1 fails\\n'); quit(status = 4) }",
    "Sys.sleep(300)"
  ), script)
  started <- Sys.time()
  output <- run_command(multigpu_config()$python, c(
    "-m", "multigpu.launch", "--workers", "2", "--startup-timeout", "0", "--",
    shQuote(file.path(R.home("bin"), "Rscript")), "--vanilla", shQuote(script)))
  expect_identical(attr(output, "status"), 4L)
  expect_true(any(grepl("worker 1 exited with code 4", output)))
  expect_true("[worker 1] R worker 1 fails" %in% output)
  expect_lt(as.numeric(difftime(Sys.time(), started, units = "secs")), 120)
})

test_that("multi_worker_strategy() reads TF_CONFIG as R sees it and names a malformed one", {
  skip_if_no_multigpu()
  withr::with_envvar(c(TF_CONFIG = '{"cluster": {}}'), {
    expect_error(multi_worker_strategy(), "Invalid TF_CONFIG environment variable: received \"{",
                 fixed = TRUE, class = "multigpu_value_error")
  })
  # Python's copy of the environment follows R's again.
  reticulate::import("multigpu.cluster.resolver")$use_environment(as.list(Sys.getenv()))
  expect_null(reticulate::import("os")$environ$get("TF_CONFIG"))
})
