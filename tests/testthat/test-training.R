test_that("keras3's compile() and fit() train a parallel model, through the bridge", {
  skip_if_no_multigpu()
  parallel <- multi_gpu_model(tiny_model(), gpus = 2)
  expect_invisible(result <- parallel %>% compile(loss = "sparse_categorical_crossentropy",
                                                  metrics = "accuracy"))
  expect_identical(result, parallel)
  expect_invisible(history <- parallel |>
    fit(iris_x(), iris_y(), epochs = 3, batch_size = 50, verbose = 0))
  expect_s3_class(history, "keras_training_history")
  expect_length(history$metrics$loss, 3L)
  expect_named(history$metrics, c("accuracy", "loss"), ignore.order = TRUE)
  # The core's errors reach R classed, in R spelling, under keras3's methods.
  expect_error(parallel |> fit(iris_x(), iris_y(), batch_size = 0, verbose = 0),
               "batch_size", class = "multigpu_value_error")
  # Keras resolves the loss when training starts; its error reaches R.
  parallel |> compile(loss = "no_such_loss")
  expect_error(parallel |> fit(iris_x(), iris_y(), verbose = 0), "no_such_loss",
               class = "multigpu_python_error")
})

test_that("fit() refuses in R what R alone sees, naming the argument, the value and the fix", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()
  before <- parallel$get_weights()
  expect_fit_error <- function(..., message, class = "multigpu_value_error") {
    error <- tryCatch(fit(parallel, ..., verbose = 0), error = identity)
    expect_s3_class(error, c(class, "multigpu_error"))
    expect_false(inherits(error, "multigpu_python_error"))
    expect_match(conditionMessage(error), message, fixed = TRUE)
  }
  # reticulate would send NA as TRUE; keras3's as.integer() would train
  # with 2 rows for 2.5 and pass NA on.
  expect_fit_error(iris_x(), iris_y(), batch_size = NA,
                   message = "`batch_size` contains NA or NaN: received NA. Use a whole number >= 1, such as batch_size = 2.")
  expect_fit_error(iris_x(), iris_y(), epochs = NA, message = "`epochs` contains NA or NaN: received NA.")
  expect_fit_error(iris_x(), iris_y(), batch_size = 2.5,
                   message = "`batch_size` is not a whole number: received 2.5. Use a whole number >= 1, such as batch_size = 2.")
  expect_fit_error(iris_x(), iris_y(), validation_batch_size = 1.5,
                   message = "`validation_batch_size` is not a whole number: received 1.5.")
  expect_fit_error(iris_x(), iris_y(), shuffle = NA, message = "`shuffle` must be TRUE or FALSE, not NA.")
  expect_fit_error(iris_x(), iris_y(), validation_split = NA,
                   message = "`validation_split` must not be NA: received NA, which Python would read as TRUE. See ?fit")
  # A factor's codes would be one feature; a data frame would reach Keras
  # as one input per column.
  expect_fit_error(iris_y(), iris_y(), class = "multigpu_type_error",
                   message = "`x` is a factor (c(\"setosa\", ")
  expect_fit_error(iris_y(), iris_y(), class = "multigpu_type_error",
                   message = "As an input, pass its 0-based class codes as a one-column matrix, matrix(as.integer(x) - 1L), or one-hot columns from model.matrix().")
  expect_fit_error(iris[1:4], iris_y(), class = "multigpu_type_error",
                   message = "`x` is a data frame (150 x 4), which keras3 would send to Keras as one input per column. Pass a matrix: as.matrix(x), or data.matrix(x) to turn factor columns into numbers.")
  expect_fit_error(iris_x(), iris[5], class = "multigpu_type_error",
                   message = "`y` is a data frame (150 x 1), which keras3 would send to Keras as one target per column. Pass a vector or matrix: y[[1]]")
  expect_fit_error(iris_x(), iris_y(), validation_data = list(iris[1:4], iris_y()),
                   class = "multigpu_type_error", message = "`validation_data[[1]]` is a data frame (150 x 4)")
  expect_fit_error(iris_x(), iris_y(), validation_data = list(iris_x(), as.character(iris_y())),
                   class = "multigpu_type_error", message = "`validation_data[[2]]` holds strings")
  # The error names the call as written, and nothing trained.
  error <- tryCatch(parallel |> fit(iris[1:4], iris_y()), error = identity)
  expect_identical(conditionCall(error), quote(fit(parallel, iris[1:4], iris_y())))
  expect_identical(parallel$get_weights(), before)
})

test_that("evaluate(), predict() and compile() refuse the same in R", {
  skip_if_no_multigpu()
  parallel <- compiled_parallel()
  expect_error(evaluate(parallel, iris[1:4], iris_y(), verbose = 0),
               "`x` is a data frame (150 x 4)", fixed = TRUE, class = "multigpu_type_error")
  expect_error(evaluate(parallel, iris_x(), iris_y(), batch_size = NA, verbose = 0),
               "`batch_size` contains NA or NaN: received NA.", fixed = TRUE, class = "multigpu_value_error")
  expect_error(predict(parallel, iris_y(), verbose = 0),
               "`x` is a factor", fixed = TRUE, class = "multigpu_type_error")
  expect_error(predict(parallel, iris_x(), steps = 2.5, verbose = 0),
               "`steps` is not a whole number: received 2.5.", fixed = TRUE, class = "multigpu_value_error")
  expect_error(parallel |> compile(loss = NA),
               "`loss` must not be NA: received NA, which Python would read as TRUE. See ?compile",
               fixed = TRUE, class = "multigpu_value_error")
  expect_identical(dim(predict(parallel, iris_x(1:4), verbose = 0)), c(4L, 3L))
})

test_that("the training methods are registered for multigpu's own models only", {
  for (generic in c("compile", "fit", "evaluate", "predict")) {
    expect_type(utils::getS3method(generic, "multigpu.engines.template.TemplateBacked"), "closure")
    expect_null(utils::getS3method(generic, "keras.src.trainers.trainer.Trainer",
                                   optional = TRUE))
  }
  skip_if_no_multigpu()
  classes <- class(multi_gpu_model(tiny_model(), gpus = 2))
  # multigpu's class first, then keras3's Model, whose methods run next.
  expect_lt(match("multigpu.engines.template.TemplateBacked", classes),
            match("keras.src.models.model.Model", classes))
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
  expect_identical(evaluate(parallel, x = iris_x(), y = iris_y(), verbose = 0), scores)

  predictions <- parallel |> predict(iris_x(1:7), verbose = 0)
  expect_true(is.matrix(predictions))
  expect_identical(dim(predictions), c(7L, 3L))
  expect_equal(rowSums(predictions), rep(1, 7), tolerance = 1e-5)
  expect_equal(predictions, parallel$predict(x32, verbose = 0L)[1:7, ], tolerance = 1e-6)
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

test_that("keras3's gradient_accumulation_steps equals one step on the larger batch, on both engines", {
  skip_if_no_multigpu()
  x <- iris_x(c(1:12, 51:62, 101:112))
  y <- iris_y(c(1:12, 51:62, 101:112))
  for (engine in c("replicate", "mirrored")) {
    template <- tiny_model()
    reference <- keras3::clone_model(template)
    reference$set_weights(template$get_weights())
    parallel <- multi_gpu_model(template, gpus = 2, engine = engine)
    parallel |> compile(
      optimizer = keras3::optimizer_sgd(learning_rate = 0.2, momentum = 0.5,
                                        gradient_accumulation_steps = 3),
      loss = "sparse_categorical_crossentropy")
    parallel |> fit(x, y, batch_size = 6, epochs = 1, shuffle = FALSE, verbose = 0)
    reference |> compile(optimizer = keras3::optimizer_sgd(learning_rate = 0.2, momentum = 0.5),
                         loss = "sparse_categorical_crossentropy")
    reference |> fit(x, as.integer(y) - 1L, batch_size = 18, epochs = 1,
                     shuffle = FALSE, verbose = 0)
    got <- unlist(lapply(template$get_weights(), as.numeric))
    want <- unlist(lapply(reference$get_weights(), as.numeric))
    expect_equal(got, want, tolerance = 1e-5, label = engine)
    expect_equal(as.numeric(parallel$optimizer$iterations$numpy()), 2)
  }
})

test_that("after each of three failed fit() calls, collecting and fitting again do not hang", {
  # A failed fit() frees its tf.data iterator before the error reaches R;
  # freed later by a garbage collection it could leave the process asleep
  # for up to a minute (docs/tf-data-stall.md). The bounds are on that
  # sleep, measured as tests/python/engines/test_failed_fit.py does (its
  # comments give the numbers): under 0.5 s in a collection; in the next
  # fit(), whose own iterator TensorFlow may stall at the epoch's end for
  # up to twice its age, 2 s plus twice the fit's busy time. Wall time
  # would measure the other test processes of R CMD check too.
  skip_if_no_multigpu()
  skip_if_not(file.exists("/proc/self/task"), "no per-thread states in /proc (not Linux)")
  idle <- reticulate::import_from_path("process_idle", test_path("..", "shared"))
  # Evaluates `expr` (in the caller's environment); returns its IdleTime.
  timed <- function(expr) {
    timing <- idle$IdleTime()
    timing$`__enter__`()
    tryCatch(force(expr), finally = timing$`__exit__`(NULL, NULL, NULL))
    timing
  }
  parallel <- multi_gpu_model(tiny_model(), gpus = 2, engine = "mirrored")
  parallel |> compile(optimizer = "sgd", loss = "sparse_categorical_crossentropy")
  x <- iris_x(1:32)
  y <- iris_y(1:32)
  parallel |> fit(x, y, batch_size = 8, epochs = 1, verbose = 0)
  raises <- reticulate::py_run_string(paste(
    "import keras",
    "class Raises(keras.callbacks.Callback):",
    "    def __init__(self, error):",
    "        super().__init__()",
    "        self.error = error",
    "    def on_train_batch_end(self, batch, logs=None):",
    "        if batch == 1:",
    "            raise self.error",
    sep = "\n"), local = TRUE)$Raises
  builtins <- reticulate::import_builtins()
  failures <- list(
    na = list(x = replace(x, cbind(12, 1), NA), callbacks = list()),
    callback = list(x = x, callbacks = list(raises(builtins$RuntimeError("stopped")))),
    interrupt = list(x = x, callbacks = list(raises(builtins$KeyboardInterrupt("stopped")))))
  python_gc <- reticulate::import("gc")
  for (how in names(failures)) {
    failure <- failures[[how]]
    caught <- tryCatch({
      fit(parallel, failure$x, y, batch_size = 8, epochs = 2, shuffle = FALSE,
          verbose = 0, callbacks = failure$callbacks)
      NULL
    }, error = identity, interrupt = identity)
    expect_true(inherits(caught, c("error", "interrupt")), label = how)
    Sys.sleep(2)  # the session shows the error; the iterator ages
    rm(caught)
    # reticulate keeps the last Python error, frames included, until the
    # next one: let it go, as a session does once another error comes.
    reticulate::py_clear_last_error()
    collecting <- timed({gc(); python_gc$collect()})
    fitting <- timed(
      history <- parallel |> fit(x, y, batch_size = 8, epochs = 1, verbose = 0))
    expect_lt(collecting$idle, 0.5, label = paste(how, "collection's sleep"))
    expect_lt(fitting$idle, 2 + 2 * (fitting$wall - fitting$idle),
              label = paste(how, "next fit()'s sleep"))
    expect_true(all(is.finite(history$metrics$loss)), label = how)
  }
})
