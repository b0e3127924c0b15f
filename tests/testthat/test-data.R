batch_sizes <- function(dataset) {
  vapply(reticulate::iterate(dataset), function(batch) {
    features <- if (is.list(batch)) batch[[1]] else batch
    nrow(features$numpy())
  }, integer(1))
}

test_that("distributed_dataset() batches at the global batch size", {
  skip_if_no_multigpu()
  strategy <- mirrored_strategy()  # 4 replicas
  x <- matrix(stats::runif(400), ncol = 4)
  dataset <- distributed_dataset(x, rowSums(x), per_replica_batch_size = 10,
                                 strategy = strategy)
  expect_s3_class(dataset, "tensorflow.python.data.ops.dataset_ops.DatasetV2")
  expect_identical(batch_sizes(dataset), c(40L, 40L, 20L))
  dropped <- distributed_dataset(x, rowSums(x), per_replica_batch_size = 10,
                                 strategy = strategy, drop_remainder = TRUE)
  expect_identical(batch_sizes(dropped), c(40L, 40L))
  # A model from multi_gpu_model() counts its devices.
  parallel <- multi_gpu_model(tiny_model(), gpus = 2)
  expect_identical(batch_sizes(distributed_dataset(x, per_replica_batch_size = 25, strategy = parallel)),
                   c(50L, 50L))
})

test_that("R data arrives as float32 features, int32 labels and 0-based factor codes", {
  skip_if_no_multigpu()
  dataset <- distributed_dataset(iris_x(), iris_y(), per_replica_batch_size = 75,
                                 strategy = mirrored_strategy(2))
  spec <- dataset$element_spec
  expect_identical(spec[[1]]$dtype$name, "float32")
  expect_identical(spec[[2]]$dtype$name, "int32")
  batch <- reticulate::iter_next(reticulate::as_iterator(dataset))
  labels <- batch[[2]]$numpy()
  expect_identical(sort(unique(as.integer(labels))), 0:2)
  # Several inputs: an unnamed list is a tuple of arrays, a named one a dict.
  two <- distributed_dataset(list(iris_x(), iris_x()[, 1:2]), iris_y(),
                             per_replica_batch_size = 10, strategy = mirrored_strategy(2))
  expect_length(two$element_spec[[1]], 2L)
  named <- distributed_dataset(list(a = iris_x(), b = iris_x()[, 1:2]),
                               per_replica_batch_size = 10, strategy = mirrored_strategy(2))
  expect_named(named$element_spec, c("a", "b"), ignore.order = TRUE)
})

test_that("shuffle with a seed is reproducible; cache and prefetch are accepted", {
  skip_if_no_multigpu()
  x <- matrix(as.double(1:200), ncol = 2)
  first_rows <- function(...) {
    dataset <- distributed_dataset(x, per_replica_batch_size = 5,
                                   strategy = mirrored_strategy(2), ...)
    as.vector(reticulate::iter_next(reticulate::as_iterator(dataset))$numpy()[, 1])
  }
  expect_identical(first_rows(shuffle = TRUE, seed = 3), first_rows(shuffle = TRUE, seed = 3))
  expect_false(identical(first_rows(shuffle = TRUE, seed = 3), first_rows()))
  expect_identical(first_rows(), as.double(1:10))
  expect_identical(first_rows(cache = TRUE), as.double(1:10))
  expect_identical(first_rows(cache = "memory", prefetch = FALSE), as.double(1:10))
  prefix <- file.path(withr::local_tempdir(), "cache")
  expect_identical(first_rows(cache = prefix), as.double(1:10))
  expect_identical(first_rows(cache = FALSE, shuffle = TRUE, shuffle_buffer = 10, seed = 1),
                   first_rows(shuffle = TRUE, shuffle_buffer = 10, seed = 1))
})

test_that("distributed_dataset() rejects NA and non-whole numbers in R, the rest in Python", {
  skip_if_no_multigpu()
  x <- matrix(stats::runif(40), ncol = 4)
  strategy <- mirrored_strategy(2)
  expect_error(distributed_dataset(x, per_replica_batch_size = NA), "`per_replica_batch_size` contains NA",
               class = "multigpu_value_error")
  expect_error(distributed_dataset(x, per_replica_batch_size = 2.5), "`per_replica_batch_size` is not a whole number",
               class = "multigpu_value_error")
  expect_error(distributed_dataset(x, seed = 1.5, shuffle = TRUE), "`seed` is not a whole number",
               class = "multigpu_value_error")
  expect_error(distributed_dataset(x, shuffle = NA), "`shuffle` must be TRUE or FALSE, not NA",
               class = "multigpu_value_error")
  expect_error(distributed_dataset(x, cache = NA), "`cache` must be TRUE or FALSE, not NA",
               class = "multigpu_value_error")
  expect_error(distributed_dataset(x, prefetch = NA), "`prefetch` must be TRUE or FALSE, not NA",
               class = "multigpu_value_error")
  expect_error(distributed_dataset(x, per_replica_batch_size = 0, strategy = strategy),
               "Invalid `per_replica_batch_size`: received 0; expected an int >= 1", fixed = TRUE,
               class = "multigpu_value_error")
  expect_error(distributed_dataset(x, shard_policy = "rows", strategy = strategy),
               'Invalid `shard_policy`: received "rows"', fixed = TRUE, class = "multigpu_value_error")
  expect_error(distributed_dataset(x, cache = file.path(tempdir(), "no", "such", "dir", "c"), strategy = strategy),
               "Invalid `cache`", class = "multigpu_value_error")
  expect_error(distributed_dataset(x, x[1:5, ], strategy = strategy),
               "different numbers of rows", class = "multigpu_value_error")
  expect_error(distributed_dataset(x, strategy = "mirrored"), "Invalid `strategy`",
               class = "multigpu_type_error")
})

test_that("the core's data warnings are R warnings", {
  skip_if_no_multigpu()
  x <- matrix(stats::runif(32), ncol = 4)  # 8 rows
  expect_warning(
    distributed_dataset(x, per_replica_batch_size = 64, strategy = mirrored_strategy(4)),
    "The data has 8 rows, fewer than one global batch", class = "multigpu_warning"
  )
  x <- matrix(stats::runif(40), ncol = 4)  # 10 rows: a last batch of 2 for 4 devices
  expect_warning(
    distributed_dataset(x, per_replica_batch_size = 2, strategy = mirrored_strategy(4)),
    "The final batch has 2 row\\(s\\), fewer than the 4 replicas", class = "multigpu_warning"
  )
})
