same_predictions <- function(a, b, x) {
  expect_equal(predict(a, x, verbose = 0), predict(b, x, verbose = 0),
               tolerance = 1e-5)
}

test_that("multi_gpu_model() replicates a model on every device by default", {
  skip_if_no_multigpu()
  model <- tiny_model()
  parallel <- multi_gpu_model(model)
  expect_s3_class(parallel, "multigpu.engines.tensorflow.replicate.ParallelModel")
  expect_s3_class(parallel, "keras.src.models.model.Model")
  expect_identical(parallel$devices, sprintf("/device:CPU:%d", 0:3))
  expect_identical(parallel$merge_device, "/device:CPU:0")
  expect_true(reticulate::py_id(parallel$template) == reticulate::py_id(model))
  same_predictions(parallel, model, iris_x(1:10))
})

test_that("one number is a device count, also when written c(3)", {
  skip_if_no_multigpu()
  model <- tiny_model()
  expect_identical(multi_gpu_model(model, gpus = 2)$devices, c("/device:CPU:0", "/device:CPU:1"))
  expect_length(multi_gpu_model(model, gpus = 3L)$devices, 3L)
  # The original R wrapper's trap: c(3) is the number 3, so three devices.
  expect_identical(multi_gpu_model(model, gpus = c(3))$devices, sprintf("/device:CPU:%d", 0:2))
  expect_identical(unlist(multi_gpu_model(model, gpus = 2)$batch_split(65)), c("/device:CPU:0", "32", "/device:CPU:1", "33"))
})

test_that("device names select devices; two or more numbers are GPU ids", {
  skip_if_no_multigpu()
  model <- tiny_model()
  expect_identical(multi_gpu_model(model, gpus = c("/cpu:0", "/cpu:2"))$devices,
                   c("/device:CPU:0", "/device:CPU:2"))
  expect_identical(multi_gpu_model(model, gpus = list("/cpu:3", "/cpu:1"))$devices,
                   c("/device:CPU:3", "/device:CPU:1"))
  error <- tryCatch(multi_gpu_model(model, gpus = c(0, 1)), error = identity)
  expect_s3_class(error, c("multigpu_value_error", "multigpu_python_error"))
  expect_match(conditionMessage(error), "received c(0, 1). GPU ids were given but this machine has no GPU", fixed = TRUE)
})

test_that("the Python core rejects device sets that cannot work, naming what the machine has", {
  skip_if_no_multigpu()
  model <- tiny_model()
  expect_error(multi_gpu_model(model, gpus = 1), "A device count must be >= 2, not 1", fixed = TRUE,
               class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, gpus = 5), "CPU devices: /device:CPU:0, /device:CPU:1, /device:CPU:2, /device:CPU:3",
               fixed = TRUE, class = "multigpu_value_error")
  # A list is always a list, even of one: GPU id 3 alone is no device set.
  expect_error(multi_gpu_model(model, gpus = list(3)), "received list(3). A device list needs at least 2 entries, not 1",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, gpus = "/cpu:0"), "A device list needs at least 2 entries, not 1",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, gpus = c("/cpu:0", "/cpu:0")), "appear more than once",
               class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, gpus = c("/cpu:0", "/cpu:9")), 'Unknown device(s) list("/cpu:9")',
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, gpus = TRUE), "TRUE is neither a device count nor a device set. ",
               fixed = TRUE, class = "multigpu_value_error")
})

test_that("NA, NaN, negative and non-whole gpus are rejected in R, naming the argument", {
  skip_if_no_multigpu()
  model <- tiny_model()
  for (gpus in list(NA, NaN, -2, 1.5, c(0, NA), c(0, 1.5), NA_character_)) {
    error <- tryCatch(multi_gpu_model(model, gpus = gpus), error = identity)
    expect_s3_class(error, "multigpu_value_error")
    expect_false(inherits(error, "multigpu_python_error"))
    expect_match(conditionMessage(error), "^`gpus` ")
  }
  expect_identical(conditionCall(tryCatch(multi_gpu_model(model, gpus = -2), error = identity)),
                   quote(multi_gpu_model(model, gpus = -2)))
})

test_that("cpu_merge and cpu_relocation are flags: NA is rejected in R, other values by Python", {
  skip_if_no_multigpu()
  model <- tiny_model()
  expect_error(multi_gpu_model(model, cpu_merge = NA), "`cpu_merge` must be TRUE or FALSE, not NA",
               class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, cpu_relocation = NA), "`cpu_relocation` must be TRUE or FALSE, not NA",
               class = "multigpu_value_error")
  expect_error(multi_gpu_model(model, cpu_merge = "yes"), 'Invalid `cpu_merge`: received "yes"; expected TRUE or FALSE',
               fixed = TRUE, class = "multigpu_value_error")
})

test_that("cpu_merge = FALSE merges on the first device", {
  skip_if_no_multigpu()
  parallel <- multi_gpu_model(tiny_model(), gpus = c("/cpu:2", "/cpu:3"), cpu_merge = FALSE)
  expect_identical(parallel$merge_device, "/device:CPU:2")
})

test_that("cpu_relocation = TRUE keeps the weights in a CPU copy of the template", {
  skip_if_no_multigpu()
  model <- tiny_model()
  parallel <- multi_gpu_model(model, gpus = 2, cpu_relocation = TRUE)
  expect_false(reticulate::py_id(parallel$template) == reticulate::py_id(model))
  same_predictions(parallel, model, iris_x(1:10))
})

test_that("the model must be a Keras model", {
  skip_if_no_multigpu()
  expect_error(multi_gpu_model(iris), "`model` must be a Keras model, not a data frame (150 x 5)",
               fixed = TRUE, class = "multigpu_type_error")
  error <- tryCatch(multi_gpu_model(reticulate::import_builtins()$object()), error = identity)
  expect_s3_class(error, c("multigpu_type_error", "multigpu_python_error"))
  expect_match(conditionMessage(error), "received an object of type object; expected a keras.Model", fixed = TRUE)
  expect_error(multi_gpu_model(tiny_model(), engine = 2), "`engine` must be a single string, not 2",
               class = "multigpu_value_error")
})

test_that("both pipes read top-down, and training the parallel model trains the template", {
  skip_if_no_multigpu()
  model <- tiny_model()
  parallel <- model %>% multi_gpu_model(gpus = 2)
  expect_identical(parallel$devices, c("/device:CPU:0", "/device:CPU:1"))
  parallel <- model |> multi_gpu_model(gpus = 4)
  before <- model$get_weights()
  parallel |> compile(optimizer = "sgd", loss = "sparse_categorical_crossentropy")
  parallel |> fit(iris_x(), iris_y(), epochs = 1, batch_size = 64, verbose = 0)
  after <- model$get_weights()
  expect_false(isTRUE(all.equal(before, after)))
  same_predictions(parallel, model, iris_x(1:10))
})

test_that("in a fresh session, the CPU fallback warning is an R warning", {
  skip_if_no_multigpu()
  output <- run_r('
    library(multigpu)
    virtual_devices(2)
    keras <- reticulate::import("keras")
    model <- keras$Sequential(list(keras$Input(shape = list(2L)), keras$layers$Dense(1L)))
    w <- tryCatch(multi_gpu_model(model), multigpu_warning = identity)
    cat("class:", class(w)[1], "\\n")
    cat("message:", conditionMessage(w), "\\n")
    cat("call:", deparse(conditionCall(w)), "\\n")
  ', env = paste0("RETICULATE_PYTHON=", multigpu_config()$python))
  output <- paste(output, collapse = "\n")
  expect_match(output, "class: multigpu_warning", fixed = TRUE)
  expect_match(output, 'message: No GPU found: using the 2 logical CPU devices c("/device:CPU:0", "/device:CPU:1").', fixed = TRUE)
  expect_match(output, "call: multi_gpu_model(model)", fixed = TRUE)
})

test_that("a Sequential model without an input runs once built, and says so before", {
  skip_if_no_multigpu()
  keras <- keras_py()
  model <- keras$Sequential(list(keras$layers$Dense(5L), keras$layers$Dense(3L)))
  expect_error(multi_gpu_model(model, gpus = 2), "has not been built.*model\\(x\\[:1\\]\\)",
               class = "multigpu_value_error")
  model(iris_x(1:7))  # builds it on a batch of 7 rows
  parallel <- multi_gpu_model(model, gpus = 2)
  same_predictions(parallel, model, iris_x(1:5))
})

test_that("a parallel model is not replicated again: the error points to its template", {
  skip_if_no_multigpu()
  parallel <- multi_gpu_model(tiny_model(), gpus = 2)
  expect_error(multi_gpu_model(parallel, gpus = 2),
               "is already a parallel model (from multi_gpu_model() or model_parallel())",
               fixed = TRUE, class = "multigpu_value_error")
})

test_that("engine = \"auto\" is the default and runs the replicate engine on logical CPU devices", {
  skip_if_no_multigpu()
  expect_identical(formals(multi_gpu_model)$engine, "auto")
  parallel <- multi_gpu_model(tiny_model(), gpus = 2)
  expect_identical(parallel$engine, "replicate")
  expect_match(parallel$engine_reason, "logical CPU devices", fixed = TRUE)
  mirrored <- multi_gpu_model(tiny_model(), gpus = 2, engine = "mirrored")
  expect_identical(mirrored$engine, "mirrored")
  expect_identical(mirrored$engine_reason, 'requested with engine = "mirrored"')
})

test_that("engine = \"auto\" warns once, in R's spelling, when cpu_merge = FALSE rules out its pick", {
  skip_if_no_multigpu()
  # Which engine wins on GPUs only a GPU can measure; here the decision is
  # checked by letting the core read the 4 logical devices as 4 GPUs, where
  # it predicts the mirrored engine.
  reticulate::py_run_string(paste(
    "import multigpu.engines.choice as _choice",
    "_choose = _choice.choose_engine",
    "_choice.choose_engine = lambda devices: _choose(",
    "    ['/device:GPU:%d' % i for i in range(len(devices))])", sep = "\n"))
  on.exit(reticulate::py_run_string("_choice.choose_engine = _choose"), add = TRUE)
  warnings <- list()
  parallel <- withCallingHandlers(
    multi_gpu_model(tiny_model(), gpus = 4, cpu_merge = FALSE),
    multigpu_warning = function(w) {
      warnings[[length(warnings) + 1L]] <<- conditionMessage(w)
      invokeRestart("muffleWarning")
    })
  expect_length(warnings, 1L)
  expect_match(warnings[[1]], 'engine = "auto" would pick the mirrored engine', fixed = TRUE)
  expect_match(warnings[[1]], "but cpu_merge = FALSE places the merge", fixed = TRUE)
  expect_match(warnings[[1]], 'using engine = "replicate"', fixed = TRUE)
  expect_identical(parallel$engine, "replicate")
  expect_identical(parallel$merge_device, "/device:CPU:0")
})

test_that("sync_batchnorm must be NULL, TRUE or FALSE, refused in R naming the value and the fix", {
  skip_if_no_multigpu()
  model <- tiny_model()
  for (value in list(NA, "yes", 1, c(TRUE, FALSE), logical(0))) {
    error <- tryCatch(multi_gpu_model(model, gpus = 4, sync_batchnorm = value),
                      error = identity)
    expect_s3_class(error, "multigpu_value_error")
    expect_match(conditionMessage(error), "`sync_batchnorm` must be NULL, TRUE or FALSE, not ",
                 fixed = TRUE)
    expect_match(conditionMessage(error), "TRUE takes BatchNormalization statistics over the whole batch",
                 fixed = TRUE)
    expect_match(conditionMessage(error), "NULL, the default, is the backend's choice: FALSE on TensorFlow",
                 fixed = TRUE)
  }
  # NULL, the default, is the backend's choice: FALSE on TensorFlow.
  expect_false(multi_gpu_model(model, gpus = 4)$sync_batchnorm)
  expect_false(multi_gpu_model(model, gpus = 4, sync_batchnorm = NULL)$sync_batchnorm)
})

test_that("sync_batchnorm = TRUE: a keras3 BatchNormalization model's step equals the template's, on both engines", {
  skip_if_no_multigpu()
  skip_if_not_installed_unloaded("keras3")
  bn_model <- function() {
    keras3::set_random_seed(5)
    keras3::keras_model_sequential(input_shape = 4) |>
      keras3::layer_dense(8) |>
      keras3::layer_batch_normalization(momentum = 0.5) |>
      keras3::layer_dense(1)
  }
  moving <- function(model) {
    norm <- model$layers[[2]]
    list(as.array(norm$moving_mean$value), as.array(norm$moving_variance$value))
  }
  set.seed(4)
  x <- matrix(rnorm(13 * 4), 13, 4)
  y <- x %*% (1:4)
  for (engine in c("replicate", "mirrored")) {
    template <- bn_model()
    reference <- bn_model()
    parallel <- multi_gpu_model(template, gpus = 4, engine = engine,
                                sync_batchnorm = TRUE)
    expect_true(parallel$sync_batchnorm)
    for (model in list(parallel, reference)) {
      model |> compile(optimizer = keras3::optimizer_sgd(0.1), loss = "mse")
      # Batches of 10 and 3 rows on 4 devices: shares of unequal size, and
      # on the mirrored engine a replica with none.
      model |> fit(x, y, batch_size = 10, epochs = 1, shuffle = FALSE, verbose = 0)
    }
    differences <- mapply(function(u, v) max(abs(u - v)),
                          keras3::get_weights(template), keras3::get_weights(reference))
    expect_lt(max(differences), 1e-5)
    expect_equal(moving(template), moving(reference), tolerance = 1e-5)
    expect_gt(max(abs(moving(template)[[1]])), 0)
  }
})
