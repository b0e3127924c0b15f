# The bridge to Python (bridge.R): Python exceptions and warnings become R
# conditions, output reaches knitr, and the core speaks R.

test_that("Python exceptions become classed R errors carrying the Python message", {
  skip_if_no_multigpu()
  builtins <- reticulate::import_builtins()
  caller <- function(value) with_python(builtins$int(value))
  error <- tryCatch(caller("x"), error = identity)
  expect_s3_class(error, c("multigpu_value_error", "multigpu_python_error", "multigpu_error", "error", "condition"), exact = TRUE)
  expect_identical(conditionMessage(error), "invalid literal for int() with base 10: 'x'")
  expect_identical(conditionCall(error), quote(caller("x")))
  expect_identical(error$python_type, "ValueError")
  expect_type(error$python_traceback, "character")
  expect_s3_class(error$python_exception, "python.builtin.ValueError")

  expect_error(with_python(builtins$len(5L)), "object of type 'int' has no len()",
               class = "multigpu_type_error")
  expect_error(with_python(reticulate::py_eval("(_ for _ in ()).throw(RuntimeError('boom'))")),
               "^boom$", class = "multigpu_runtime_error")
  # Subclasses map through the exception's class hierarchy:
  # FileNotFoundError is an OSError.
  missing <- file.path(tempdir(), "no-such-file")
  error <- tryCatch(with_python(builtins$open(missing)), error = identity)
  expect_s3_class(error, "multigpu_os_error")
  expect_match(conditionMessage(error), "No such file or directory", fixed = TRUE)
  expect_identical(error$python_type, "FileNotFoundError")
  # Other exceptions are multigpu_python_error only.
  error <- tryCatch(with_python(reticulate::py_eval("{}", convert = FALSE)$pop("key")), error = identity)
  expect_s3_class(error, c("multigpu_python_error", "multigpu_error", "error", "condition"), exact = TRUE)
  expect_identical(error$python_type, "KeyError")
})

test_that("R errors raised while calling Python pass through unchanged", {
  skip_if_no_multigpu()
  error <- tryCatch(with_python(stop("plain R error")), error = identity)
  expect_identical(conditionMessage(error), "plain R error")
  expect_false(inherits(error, "multigpu_error"))
  # A multigpu error raised in R keeps its class.
  expect_error(with_python(multigpu_abort("r side")), "r side", class = "multigpu_value_error")
})

test_that("Python warnings become R warnings of class multigpu_warning", {
  skip_if_no_multigpu()
  warnings <- reticulate::import("warnings")
  expect_warning(
    with_python(warnings$warn("careful")),
    "^careful$", class = "multigpu_warning"
  )
  caught <- list()
  withCallingHandlers(
    with_python({
      warnings$warn("first", reticulate::import_builtins()$RuntimeWarning)
      warnings$warn("second")
      "value"
    }),
    multigpu_warning = function(w) {
      caught[[length(caught) + 1L]] <<- w
      invokeRestart("muffleWarning")
    }
  )
  expect_length(caught, 2L)
  expect_identical(conditionMessage(caught[[1]]), "first")
  expect_identical(caught[[1]]$python_type, "RuntimeWarning")
  expect_identical(caught[[2]]$python_type, "UserWarning")
  expect_identical(suppressWarnings(with_python({warnings$warn("x"); 42})), 42)
})

test_that("a non-local exit (an interrupt, a restart) leaves Python's warnings machinery as it was", {
  skip_if_no_multigpu()
  reticulate::py_run_string("import warnings as _w; _multigpu_test_impl = _w._showwarnmsg_impl")
  unchanged <- function() {
    reticulate::py_eval("__import__('warnings')._showwarnmsg_impl is _multigpu_test_impl")
  }
  withRestarts(with_python(invokeRestart("jump")), jump = function() NULL)
  expect_true(unchanged())
  try(with_python(stop("an R error")), silent = TRUE)
  expect_true(unchanged())
})

test_that("while knitr renders, what Python prints is printed from R", {
  skip_if_no_multigpu()
  builtins <- reticulate::import_builtins()
  withr::local_options(knitr.in.progress = TRUE)
  expect_output(value <- with_python({builtins$print("from python"); 7}), "from python")
  expect_identical(value, 7)
  # Nested calls (Python calling back into R, which calls Python) print once,
  # in order, and leave Python's output working.
  output <- capture.output(invisible(with_python({
    builtins$print("outer")
    with_python(builtins$print("inner"))
    builtins$print("after")
  })))
  expect_identical(output, c("outer", "inner", "after"))
  expect_output(with_python(builtins$print("still there")), "still there")
})

test_that("call_core() leaves out optional NULL arguments and keeps the others", {
  skip_if_no_multigpu()
  # resolve_devices(gpus=None) means "every device": NULL must reach Python.
  expect_length(call_core("resolve_devices", gpus = NULL), 4L)
  expect_identical(call_core("resolve_devices", 2L, extra = NULL, .optional = "extra"),
                   c("/device:CPU:0", "/device:CPU:1"))
  # Python refuses it (older reticulate), or R's own matching against the
  # function's signature does (later reticulate gives Python functions R
  # formals): either way the NULL was passed, not dropped.
  expect_error(call_core("resolve_devices", 2L, extra = NULL),
               "unexpected keyword argument 'extra'|unused argument \\(extra = NULL\\)")
})

# The core's messages reach R users in R spelling: NULL, TRUE, c(...), and
# the R functions' calls (virtual_devices(n)), never Python's None, True,
# ['...'] or multigpu.virtual_devices(). speaks_r() is in helper-scenarios.R.

expect_speaks_r <- function(condition, pattern) {
  message <- conditionMessage(condition)
  expect_true(speaks_r(message), label = message)
  expect_match(message, pattern, fixed = TRUE)
}

test_that("speaks_r() tells R spelling from Python spelling", {
  expect_true(speaks_r('received c("/gpu:0"); expected NULL or TRUE; call virtual_devices(n)'))
  expect_false(speaks_r("expected None"))
  expect_false(speaks_r("expected True or False"))
  expect_false(speaks_r("received ['/gpu:0']"))
  expect_false(speaks_r("received [0, 1]"))
  expect_false(speaks_r("call multigpu.virtual_devices(n) first"))
})

test_that("argument errors from the core read in R", {
  skip_if_no_multigpu()
  model <- tiny_model()
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = "a"), error = identity),
                  'received list("a"). A device list needs at least 2 entries, not 1. Expected NULL')
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = c(0, 1)), error = identity),
                  'a list of >= 2 distinct device names such as c("/gpu:0", "/gpu:1")')
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = 64), error = identity),
                  "call virtual_devices(n) before TensorFlow starts")
  expect_speaks_r(tryCatch(multi_gpu_model(model, gpus = 2, cpu_merge = FALSE,
                                           engine = "mirrored"), error = identity),
                  'received FALSE with engine = "mirrored"')
  expect_speaks_r(tryCatch(distributed_dataset(iris_x(), shuffle = "yes"), error = identity),
                  'received "yes"; expected TRUE or FALSE')
  expect_speaks_r(tryCatch(mirrored_strategy(cross_device_ops = "bogus"), error = identity),
                  "expected NULL (collective all-reduce)")
})

test_that("a late virtual_devices() names the R call", {
  skip_if_no_multigpu()
  model <- tiny_model()  # exists on the devices TensorFlow started with
  expect_speaks_r(tryCatch(virtual_devices(8), error = identity),
                  "virtual_devices(8) came too late")
})

test_that("an NA passed on to Python is refused before reticulate reads it as TRUE or \"NA\"", {
  skip_if_no_multigpu()
  expect_error(mirrored_strategy(2, cross_device_ops = NA),
               "`cross_device_ops` must not be NA: received NA, which Python would read as TRUE. See ?mirrored_strategy",
               fixed = TRUE, class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(withr::local_tempdir(), save_freq = NA_character_),
               "`save_freq` must not be NA: received NA_character_, which Python would read as the string \"NA\"",
               fixed = TRUE, class = "multigpu_value_error")
})
