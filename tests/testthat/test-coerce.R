# Argument coercion: pure R, no Python needed.

expect_value_error <- function(expr, pattern) {
  expect_error(expr, pattern, class = "multigpu_value_error")
}

test_that("as_count() turns whole numbers into integers", {
  expect_identical(as_count(2), 2L)
  expect_identical(as_count(2L), 2L)
  expect_identical(as_count(0), 0L)
  expect_identical(as_count(1e6), 1000000L)
  expect_null(as_count(NULL))
})

test_that("as_count() rejects NA, NaN, Inf, negative, non-whole and non-numbers, naming the argument", {
  epochs <- NA
  expect_value_error(as_count(epochs), "`epochs` contains NA or NaN: received NA")
  expect_value_error(as_count(NaN, "epochs"), "`epochs` contains NA or NaN")
  expect_value_error(as_count(NA_integer_, "n"), "`n` contains NA")
  expect_value_error(as_count(Inf, "n"), "`n` is infinite")
  expect_value_error(as_count(-1, "batch_size"), "`batch_size` is negative: received -1")
  expect_value_error(as_count(2.5, "batch_size"), "`batch_size` is not a whole number: received 2.5")
  expect_value_error(as_count(1e10, "n"), "`n` is too large for an integer")
  expect_value_error(as_count("5", "n"), "`n` must be a single whole number >= 1, not \"5\"")
  expect_value_error(as_count(c(1, 2), "n"), "`n` must be a single whole number >= 1, not c\\(1, 2\\)")
  expect_value_error(as_count(TRUE, "n"), "`n` must be a single whole number")
  expect_value_error(as_count(NULL, "n", null_ok = FALSE), "`n` must be a whole number >= 1, not NULL")
})

test_that("as_count() advises the smallest value the core accepts, not 0 where 0 is refused", {
  microbatches <- NA
  expect_value_error(as_count(microbatches),
                     "^`microbatches` contains NA or NaN: received NA\\. Use a whole number >= 1, such as microbatches = 2\\.$")
  expect_value_error(as_count(NULL, "per_replica_batch_size", null_ok = FALSE),
                     "^`per_replica_batch_size` must be a whole number >= 1, not NULL\\.$")
  expect_value_error(as_count(NA, "threads", minimum = 0), "Use a whole number >= 0, such as threads = 2\\.$")
  # R leaves 0 to the core, whose message says what the number means.
  expect_identical(as_count(0, "n"), 0L)
  # Any whole number, negative ones too (a seed).
  expect_identical(as_count(-3, "seed", minimum = -Inf), -3L)
  expect_value_error(as_count(NA, "seed", minimum = -Inf), "Use a whole number, such as seed = 2\\.$")
  expect_value_error(as_count(-1e10, "seed", minimum = -Inf), "`seed` is too large for an integer")
})

test_that("as_count() tells a number in quotes or a factor to be a number", {
  n <- "4"
  expect_value_error(as_count(n), "^`n` must be a single whole number >= 1, not \"4\" \\(a string\\): write n = 4, a number\\.$")
  expect_value_error(as_count(factor(2), "microbatches"),
                     "not \"2\" \\(a factor\\): write microbatches = 2, a number\\.$")
  expect_value_error(as_count("many", "n"), "^`n` must be a single whole number >= 1, not \"many\"\\.$")
})

test_that("errors name the exported function's call, not the helper's", {
  wrapper <- function(n) as_count(n)
  error <- tryCatch(wrapper(-3), error = identity)
  expect_identical(conditionCall(error), quote(wrapper(-3)))
  expect_s3_class(error, c("multigpu_value_error", "multigpu_error", "error"))
  expect_false(inherits(error, "multigpu_python_error"))
})

test_that("as_device_list() reads one number as a count and several as GPU ids", {
  expect_null(as_device_list(NULL))
  expect_identical(as_device_list(2), 2L)
  # The `gpus = c(3)` trap: c(3) is 3 in R, so it is a count, not GPU id 3.
  expect_identical(as_device_list(c(3)), 3L)
  expect_identical(as_device_list(c(0, 1)), list(0L, 1L))
  expect_identical(as_device_list(c(a = 0, b = 2)), list(0L, 2L))
  expect_identical(as_device_list(0:3), list(0L, 1L, 2L, 3L))
})

test_that("as_device_list() sends names and R lists as Python lists, whatever their length", {
  expect_identical(as_device_list(c("/cpu:0", "/cpu:1")), list("/cpu:0", "/cpu:1"))
  expect_identical(as_device_list("/gpu:0"), list("/gpu:0"))
  expect_identical(as_device_list(factor(c("/cpu:0", "/cpu:1"))), list("/cpu:0", "/cpu:1"))
  # gpus = "2" reaches the core as written, "2", which says to write the
  # number (tests/scenarios/invalid_gpus_count_as_string.json); factor(2)
  # is refused in R, echoed as the factor it is.
  expect_identical(as_device_list("2"), "2")
  expect_identical(as_device_list(" 12 "), " 12 ")
  expect_identical(as_device_list(c("2", "3")), list("2", "3"))
  expect_value_error(
    as_device_list(factor(2), "gpus"),
    "^Invalid `gpus`: received factor\\(\"2\"\\), a factor, neither a device count nor a device name\\. For 2 devices pass the number: gpus = 2\\.$"
  )
  expect_identical(as_device_list(list(3)), list(3L))
  expect_identical(as_device_list(list(0, 2)), list(0L, 2L))
  expect_identical(as_device_list(list("/cpu:0", "/cpu:1")), list("/cpu:0", "/cpu:1"))
  expect_identical(as_device_list(character()), list())
})

test_that("as_device_list() rejects NA, NaN, negative and non-whole entries in R", {
  gpus <- NA
  expect_value_error(as_device_list(gpus), "`gpus` must not be NA")
  expect_value_error(as_device_list(NaN, "gpus"), "`gpus` contains NA or NaN: received NaN")
  expect_value_error(as_device_list(-2, "gpus"), "`gpus` is negative: received -2")
  expect_value_error(as_device_list(1.5, "gpus"), "`gpus` is not a whole number: received 1.5")
  expect_value_error(as_device_list(c(0, NA), "gpus"), "`gpus` contains NA or NaN: received c\\(0, NA\\)")
  expect_value_error(as_device_list(c(0, 0.5), "devices"), "`devices` is not a whole number")
  expect_value_error(as_device_list(list(0, -1), "gpus"), "`gpus` is negative")
  expect_value_error(as_device_list(c("/cpu:0", NA), "gpus"), "`gpus` contains NA")
  expect_value_error(as_device_list(list("/cpu:0", NA_character_), "gpus"), "`gpus` contains NA")
})

test_that("as_device_list() leaves other types for the Python core to judge", {
  expect_identical(as_device_list(TRUE), TRUE)
  expect_identical(as_device_list(list(TRUE, 1)), list(TRUE, 1L))
})

test_that("as_flag() rejects NA and passes everything else on", {
  expect_true(as_flag(TRUE))
  expect_false(as_flag(FALSE))
  expect_null(as_flag(NULL))
  cpu_merge <- NA
  expect_value_error(as_flag(cpu_merge), "`cpu_merge` must be TRUE or FALSE, not NA")
  expect_identical(as_flag("yes"), "yes")
})

test_that("as_flag(null_ok = TRUE) passes NULL on, the core's default, and names it in messages", {
  sync_batchnorm <- NULL
  expect_null(as_flag(sync_batchnorm, meaning = "TRUE pools", null_ok = TRUE))
  expect_value_error(as_flag(sync_batchnorm, meaning = "TRUE pools"),
                     "`sync_batchnorm` must be TRUE or FALSE, not NULL. TRUE pools.")
  sync_batchnorm <- NA
  expect_value_error(as_flag(sync_batchnorm, meaning = "TRUE pools", null_ok = TRUE),
                     "`sync_batchnorm` must be NULL, TRUE or FALSE, not NA. TRUE pools.")
})

test_that("as_string() accepts one string or NULL", {
  expect_identical(as_string("mirrored"), "mirrored")
  expect_null(as_string(NULL))
  engine <- 1
  expect_value_error(as_string(engine), "`engine` must be a single string, not 1")
  expect_value_error(as_string(NA_character_, "engine"), "`engine` must be a single string, not NA")
  expect_value_error(as_string(c("a", "b"), "engine"), "single string")
  expect_value_error(as_string(NULL, "envname", null_ok = FALSE), "`envname` must be a single string, not NULL")
})

test_that("as_path() expands ~ and rejects non-paths", {
  expect_identical(as_path("~/model.h5"), path.expand("~/model.h5"))
  expect_value_error(as_path(NA_character_, "filepath"), "`filepath` must be a single non-empty path, not NA")
  expect_value_error(as_path("", "filepath"), "`filepath` must be a single non-empty path")
  expect_value_error(as_path(1, "filepath"), "not 1")
})

test_that("as_verbose() maps R values to Keras verbosity", {
  withr::local_options(knitr.in.progress = NULL)
  expect_identical(as_verbose("auto"), "auto")
  expect_identical(as_verbose(2), 2L)
  expect_identical(as_verbose(TRUE), 1L)
  expect_identical(as_verbose(FALSE), 0L)
  withr::local_options(knitr.in.progress = TRUE)
  expect_identical(as_verbose("auto"), 2L)
  verbose <- "loud"
  expect_value_error(as_verbose(verbose), "`verbose` must be \"auto\", 0 \\(silent\\), 1 \\(progress bar\\) or 2")
  expect_value_error(as_verbose(NA, "verbose"), "`verbose` must be")
  expect_value_error(as_verbose(1.5, "verbose"), "`verbose` is not a whole number")
})

test_that("check_no_na() refuses an NA that Python would read as a value", {
  expect_value_error(check_no_na(list(device_type = NA), "virtual_devices"),
                     "^`device_type` must not be NA: received NA, which Python would read as TRUE\\. See \\?virtual_devices")
  expect_value_error(check_no_na(list(save_freq = NA_character_), "checkpoint_callbacks"),
                     "read as the string \"NA\"")
  expect_value_error(check_no_na(list(overwrite = NA), "save_model"), "See \\?save_model_hdf5")
  args <- list(1, x = c(1, NA), y = NULL, engine = "auto")
  expect_identical(check_no_na(args, "f"), args)
})

test_that("as_callbacks() refuses R values that are no callback, naming them", {
  expect_null(as_callbacks(NULL))
  callbacks <- 1
  expect_error(as_callbacks(callbacks),
               "^`callbacks` must be a Keras callback or a list of them, such as checkpoint_callbacks\\(dir\\) or keras\\$callbacks\\$EarlyStopping\\(\\); 1 is not one\\.$",
               class = "multigpu_type_error")
  expect_error(as_callbacks(list(mean)), "entry 1, a function, is not one", class = "multigpu_type_error")
})

test_that("as_custom_objects() wants a named list", {
  expect_null(as_custom_objects(NULL))
  layers <- list(Scale = "a class")
  expect_identical(as_custom_objects(layers), layers)
  for (custom_objects in list(1, list(1), c(Scale = "x"))) {
    expect_error(as_custom_objects(custom_objects),
                 "^`custom_objects` must be NULL or a list named by the names the saved model uses",
                 class = "multigpu_type_error")
  }
})

test_that("as_string() reads a factor as its label", {
  engine <- factor("mirrored")
  expect_identical(as_string(engine), "mirrored")
})

test_that("check_model() rejects R objects with a type error naming the argument", {
  model <- iris
  expect_error(check_model(model), "`model` must be a Keras model, not a data frame \\(150 x 5\\)",
               class = "multigpu_type_error")
  expect_error(check_model(NULL, "object"), "not NULL", class = "multigpu_type_error")
})

test_that("describe() shows values briefly", {
  expect_identical(describe(NULL), "NULL")
  expect_identical(describe(c(0, NA)), "c(0, NA)")
  expect_identical(describe("a"), "\"a\"")
  expect_identical(describe(mean), "a function")
  expect_identical(describe(new.env()), "an object of class environment")
  expect_lte(nchar(describe(1:1000 + 0.5)), 70)
})

test_that("the core echoes gpus = \"2\" as written", {
  skip_if_no_multigpu()
  expect_error(multi_gpu_model(tiny_model(), gpus = "2"),
               "received \"2\". \"2\" is a string, neither a device count nor a device name",
               fixed = TRUE)
})

test_that("an NA in integer labels is named NA, not -2147483648", {
  skip_if_no_multigpu()
  parallel <- multi_gpu_model(tiny_model(), gpus = 2)
  parallel |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  y <- as.integer(iris_y()) - 1L
  y[c(3, 7)] <- NA
  expect_error(parallel |> fit(iris_x(), y, epochs = 1, verbose = 0),
               "Invalid `y`: received NA in 2 of 150 rows (the first is row 3)",
               fixed = TRUE)
  expect_error(distributed_dataset(iris_x(), y, per_replica_batch_size = 10),
               "Invalid `y`: received NA in 2 of 150 rows (the first is row 3)",
               fixed = TRUE)
})
