# The R runner of the shared scenarios (tests/scenarios/*.json).
#
# Every scenario is executed with the R API of multigpu: multi_gpu_model(),
# mirrored_strategy(), distributed_dataset(), make_or_restore_model(),
# checkpoint_callbacks(), the compile()/fit()/evaluate()/predict() methods and
# the save/load functions. Only building a model and generating data go
# through tests/scenarios/recipes.py (so both languages start from the same
# weights and numbers); reading weights and a few attributes
# (`$template`, `$devices`) uses the Python objects directly, as R users do.
#
# test-scenarios.R runs every scenario with testthat; the Python test suite
# (tests/python/support/embedded_r.py) sources this file into an R embedded in
# its own process and calls run_scenario_for_python(), then compares the
# record with the Python run's. So this file must work on its own: it uses
# only multigpu's exported functions, testthat, jsonlite and reticulate.
#
# What differs between the ways an R user drives Keras is one `api` object
# (scenario_api_plain() here; scenario_api_keras3() in
# helper-scenarios-keras3.R, as a keras3 user writes the same steps):
# compile arguments, weights, datasets, saving and loading, and which errors
# count as the expected one. compile()/fit()/evaluate()/predict() are always
# the generics: which methods they reach depends on whether keras3 is loaded.

# Where the scenario files are: $MULTIGPU_SCENARIO_DIR, or tests/scenarios
# next to this tests/testthat directory.
scenario_dir <- function() {
  dir <- Sys.getenv("MULTIGPU_SCENARIO_DIR")
  if (nzchar(dir)) return(normalizePath(dir))
  candidates <- c(
    file.path(testthat::test_path(), "..", "scenarios"),
    file.path("tests", "scenarios"),
    file.path("..", "scenarios")
  )
  found <- candidates[file.exists(file.path(candidates, "recipes.py"))]
  if (!length(found)) {
    stop("Cannot find tests/scenarios (looked in ",
         paste(normalizePath(candidates, mustWork = FALSE), collapse = ", "),
         "); set MULTIGPU_SCENARIO_DIR.", call. = FALSE)
  }
  normalizePath(found[[1]])
}

# In C-locale order, as Python sorts them (the gate's sample pairs them in
# this order, in both languages).
scenario_files <- function(dir = scenario_dir()) {
  sort(list.files(dir, pattern = "[.]json$", full.names = TRUE), method = "radix")
}

# Whether a scenario checks an invalid input: one of its steps expects an
# error.
invalid_input_scenario <- function(scenario) {
  any(vapply(scenario$steps, function(step) !is.null(step$error), logical(1)))
}

# The Keras backends a scenario applies to: its "backends" list, TensorFlow
# alone when it has none.
scenario_backends <- function(scenario) {
  unlist(scenario$backends) %||% "tensorflow"
}

# The scenario files that apply to `backend` ("tensorflow" or "jax").
scenario_files_for <- function(backend, dir = scenario_dir()) {
  files <- scenario_files(dir)
  applies <- vapply(files, function(path) {
    backend %in% scenario_backends(jsonlite::fromJSON(path, simplifyVector = FALSE))
  }, logical(1))
  files[applies]
}

# JSON numbers are read as R users write numbers, as doubles (jsonlite reads
# whole numbers as integers), so the R API's own coercion is exercised.
read_scenario <- function(path) {
  as_doubles <- function(x) {
    if (is.list(x)) {
      for (i in seq_along(x)) {
        if (!is.null(x[[i]])) x[[i]] <- as_doubles(x[[i]])
      }
      return(x)
    }
    if (is.integer(x)) as.double(x) else x
  }
  scenario <- as_doubles(jsonlite::fromJSON(path, simplifyVector = FALSE))
  scenario$name <- sub("[.]json$", "", basename(path))
  scenario
}

# tests/scenarios/recipes.py, the model recipes and data shared with Python.
scenario_recipes <- function(dir = scenario_dir()) {
  # No __pycache__ in tests/scenarios (it would end up in the R package).
  sys <- reticulate::import("sys")
  previous <- sys$dont_write_bytecode
  sys$dont_write_bytecode <- TRUE
  on.exit(sys$dont_write_bytecode <- previous)
  reticulate::import_from_path("recipes", path = dir)
}

# The R condition class each expected Python exception class maps to.
scenario_error_classes <- c(
  ValueError = "multigpu_value_error",
  TypeError = "multigpu_type_error",
  RuntimeError = "multigpu_runtime_error",
  OSError = "multigpu_os_error"
)

`%||%` <- function(x, y) if (is.null(x)) y else x

# ---- JSON values as an R user writes them ----

# A device set: strings become a character vector (c("/cpu:0", "/cpu:1")),
# two or more numbers a numeric vector of GPU ids (c(0, 1)); a list of one
# number, or a mixed list, stays a list (list(1), list(0, "/cpu:1")), since
# in R one number is a device count. A single JSON number stays a number.
scenario_devices <- function(value) {
  if (!is.list(value)) return(value)
  if (length(value) && all(vapply(value, is.character, logical(1)))) {
    return(unlist(value))
  }
  if (length(value) >= 2L && all(vapply(value, is.numeric, logical(1)))) {
    return(unlist(value))
  }
  value
}

scenario_optimizer <- function(spec) {
  if (is.null(spec)) return("rmsprop")
  if (is.character(spec)) return(spec)
  keras <- reticulate::import("keras")
  arguments <- spec[names(spec) != "class"]
  do.call(keras$optimizers[[spec$class]], arguments)
}

# Metrics: list("mae") -> "mae"; a named list per output -> named list of
# character vectors.
scenario_metrics <- function(spec) {
  if (is.null(spec)) return(NULL)
  if (is.null(names(spec))) return(unlist(spec))
  lapply(spec, unlist)
}

# Keras keeps some lists in tracking wrappers that reticulate leaves as
# Python objects; a plain Python list converts to a character vector.
# Output names as a character vector: from Keras's tracked list, which
# reticulate leaves a Python object, or from a plain list it already
# converted (one name arrives as a string, which list() would split).
scenario_names <- function(value) {
  if (inherits(value, "python.builtin.object")) {
    value <- reticulate::import_builtins()$list(value)
  }
  as.character(unlist(value))
}

scenario_compile_args <- function(spec) {
  args <- list(optimizer = scenario_optimizer(spec$optimizer), loss = spec$loss)
  if (!is.null(spec$metrics)) args$metrics <- scenario_metrics(spec$metrics)
  args
}

# ---- numbers ----

flat_outputs <- function(value) {
  if (is.list(value)) unname(value) else list(value)
}

max_difference <- function(a, b) {
  a <- flat_outputs(a)
  b <- flat_outputs(b)
  if (length(a) != length(b)) return(Inf)
  diffs <- mapply(function(u, v) {
    if (!identical(dim(u) %||% length(u), dim(v) %||% length(v))) return(Inf)
    if (!length(u)) return(0)
    max(abs(as.numeric(u) - as.numeric(v)))
  }, a, b)
  max(c(0, diffs))
}

scenario_tolerance <- function(value) if (isTRUE(value)) 1e-5 else as.numeric(value)

# ---- what a multi_gpu_model step expects, on the backend of this process ----

# The expectations name the TensorFlow engines. On JAX they read as their
# counterparts: the model of data parallelism is a ShardedModel of the "jax"
# engine there, and model_parallel()'s a ShardedWeightsModel (every weight
# split across the devices). The rows per device (`split`, the replicate
# engine's batch_split()) and model_parallel()'s `stages` have no
# counterpart: XLA splits each batch inside the compiled step, and JAX's
# model parallelism has no stages. The same reading as the Python runner's
# (tests/python/support/scenario_runner.py, on_backend()).
scenario_jax_readings <- list(model_class = c(ParallelModel = "ShardedModel",
                                              PartitionedModel = "ShardedWeightsModel"),
                              engine = c(replicate = "jax"))
scenario_tensorflow_only <- c("split", "stages")

scenario_expect_on <- function(expect, backend) {
  if (!identical(backend, "jax")) return(expect)
  expect <- expect[setdiff(names(expect), scenario_tensorflow_only)]
  for (key in intersect(names(expect), names(scenario_jax_readings))) {
    readings <- scenario_jax_readings[[key]]
    value <- expect[[key]]
    if (is.character(value) && value %in% names(readings)) {
      expect[[key]] <- unname(readings[[value]])
    }
  }
  expect
}

scenario_keras_backend <- function() {
  reticulate::import("keras")$backend$backend()
}

# ---- the plain API: multigpu's methods and functions, Keras through reticulate ----

scenario_api_plain <- function() {
  list(
    name = "plain",
    compile_args = scenario_compile_args,
    weights = function(model) model$get_weights(),
    # The data distributed_dataset() is given: the arrays.
    dataset_data = function(state) list(state$x, state$y),
    history_metrics = function(history) history$metrics,
    evaluate_metrics = function(result) lapply(result, as.numeric),
    save_model = save_model_hdf5,
    load_model = load_model_hdf5,
    save_weights = save_model_weights_hdf5,
    load_weights = load_model_weights_hdf5,
    # The condition an invalid input raises, as list(class, message,
    # from_python, rendered), or NULL for an error that is not one.
    expected_error = function(error) {
      if (!inherits(error, "multigpu_error")) return(NULL)
      matched <- vapply(scenario_error_classes, inherits, logical(1), x = error)
      list(class = names(which(matched))[1] %||% "",
           r_class = paste(class(error), collapse = "/"),
           message = conditionMessage(error),
           from_python = !is.null(error$python_type), rendered = "r")
    }
  )
}

# ---- the runner ----

#' Runs one scenario with the R API; returns its record (the numbers the
#' parity check compares). Expectations are testthat expectations: inside
#' test_that() they are reported, outside they signal an error.
run_scenario <- function(path, workdir = tempfile("scenario-"),
                         api = scenario_api_plain()) {
  scenario <- read_scenario(path)
  dir.create(workdir, recursive = TRUE, showWarnings = FALSE)
  recipes <- scenario_recipes(dirname(normalizePath(path)))
  data <- recipes$make_data(scenario$recipe, scenario$data$seed,
                            scenario$data$rows)
  state <- new.env()
  state$scenario <- scenario
  state$recipes <- recipes
  state$api <- api
  state$workdir <- workdir
  state$x <- data$x
  state$y <- data$y
  state$model <- NULL
  state$template <- NULL
  state$strategy <- NULL
  state$saved <- list()
  state$record <- list(initial_weights = NULL, steps = list(),
                       final_weights = NULL, error = NULL)
  for (i in seq_along(scenario$steps)) {
    step <- scenario$steps[[i]]
    where <- sprintf("scenario %s, step %d (%s)", scenario$name, i - 1L,
                     step$do)
    entry <- list(do = step$do)
    expected <- step$error
    if (isTRUE(getOption("multigpu.scenario_trace"))) message(where)
    runner <- scenario_steps[[step$do]]
    if (is.null(runner)) stop(where, ": unknown step")
    if (is.null(expected)) {
      entry <- suppress_multigpu_warnings(
        runner(step, step$expect %||% list(), entry, state, where))
      state$record$steps[[i]] <- entry
      next
    }
    error <- tryCatch(
      {
        suppress_multigpu_warnings(
          runner(step, step$expect %||% list(), entry, state, where))
        NULL
      },
      multigpu_error = function(e) scenario_caught(api, e),
      python.builtin.Exception = function(e) scenario_caught(api, e)
    )
    state$record$steps[[i]] <- entry
    scenario_expect(!is.null(error), sprintf(
      "%s: expected a %s (%s), but it succeeded", where, expected$class,
      expected$message))
    if (is.null(error)) return(state$record)
    scenario_expect(identical(error$class, expected$class), sprintf(
      "%s: expected a %s (%s), got %s: %s", where, expected$class,
      scenario_error_classes[[expected$class]], error$r_class, error$message))
    # An error R rendered (a multigpu condition) reads in R; one that
    # reached R as reticulate's Python exception (through keras3's methods)
    # has the core's Python wording: each is checked against its own.
    in_r <- identical(error$rendered, "r")
    expected_message <- if (in_r) expected$message_r %||% expected$message else
      expected$message
    scenario_expect(grepl(expected_message, error$message, fixed = TRUE), sprintf(
      "%s: message %s lacks %s", where, encodeString(error$message, quote = '"'),
      encodeString(expected_message, quote = '"')))
    if (in_r) {
      scenario_expect(speaks_r(error$message), sprintf(
        "%s: the R message has Python values or calls: %s", where,
        error$message))
    }
    error$r_class <- NULL
    state$record$error <- error
    return(state$record)
  }
  if (!is.null(state$template)) {
    state$record$final_weights <- api$weights(state$template)
  }
  state$record
}

# Whether a message reads in R: none of Python's spellings of values (None,
# True, False, [...] lists) or of calls (multigpu.f()). The same rule as
# `speaks("r", ...)` in tests/python/support/scenario_files.py.
speaks_r <- function(message) {
  !grepl("\\b(None|True|False)\\b|\\[['\"0-9-]|\\bmultigpu\\.[a-z_]+\\(", message,
         perl = TRUE)
}

# Python warnings (multigpu's one-time "No GPU found" notice, Keras's notes)
# are not what the scenarios check, as in the Python runner.
suppress_multigpu_warnings <- function(expr) {
  withCallingHandlers(expr, multigpu_warning = function(w) {
    invokeRestart("muffleWarning")
  })
}

# The expected error's record, as the API reads it; an error the API does
# not expect is raised again.
scenario_caught <- function(api, error) {
  caught <- api$expected_error(error)
  if (is.null(caught)) stop(error)
  caught
}

scenario_expect <- function(ok, message) {
  testthat::expect(isTRUE(ok), message)
}

in_strategy_scope <- function(state, expr_fn) {
  if (is.null(state$strategy)) return(expr_fn())
  with(state$strategy$scope(), expr_fn())
}

scenario_predict <- function(model, state, step = list()) {
  args <- list(model, state$x, verbose = 0)
  if (!is.null(step$batch_size)) args$batch_size <- step$batch_size
  do.call(predict, args)
}

scenario_dataset <- function(spec, state) {
  args <- c(state$api$dataset_data(state),
            list(per_replica_batch_size = spec$per_replica_batch_size,
                 strategy = state$strategy))
  if (!is.null(spec$drop_remainder)) args$drop_remainder <- spec$drop_remainder
  if (!is.null(spec$cache)) args$cache <- spec$cache
  do.call(distributed_dataset, args)
}

scenario_steps <- list(
  build = function(step, expect, entry, state, where) {
    s <- state$scenario
    model <- in_strategy_scope(state, function() state$recipes$build(s$recipe, s$seed))
    state$model <- state$template <- model
    if (inherits(model, "keras.src.models.model.Model")) {
      state$record$initial_weights <- state$api$weights(model)
    }
    if (!is.null(expect$params)) {
      scenario_expect(model$count_params() == expect$params,
                      sprintf("%s: %s parameters", where, model$count_params()))
    }
    entry
  },

  multi_gpu_model = function(step, expect, entry, state, where) {
    expect <- scenario_expect_on(expect, scenario_keras_backend())
    args <- state$scenario$devices %||% list()
    for (key in intersect(names(step), c("gpus", "cpu_merge", "cpu_relocation",
                                         "engine"))) {
      args[key] <- list(step[[key]])
    }
    if ("gpus" %in% names(args)) args["gpus"] <- list(scenario_devices(args$gpus))
    source <- state$model
    before <- if (inherits(source, "keras.src.models.model.Model")) {
      state$api$weights(source)
    }
    parallel <- suppress_multigpu_warnings(
      do.call(multi_gpu_model, c(list(source), args)))
    state$model <- parallel
    state$template <- parallel$template
    if (!is.null(expect$model_class)) {
      python_class <- sub(".*[.]", "", class(parallel)[[1]])
      scenario_expect(identical(python_class, expect$model_class),
                      sprintf("%s: a %s", where, python_class))
    }
    if (!is.null(expect$engine)) {
      scenario_expect(identical(parallel$engine, expect$engine),
                      sprintf("%s: engine %s", where, parallel$engine))
    }
    if (!is.null(expect$devices)) {
      scenario_expect(identical(as.character(parallel$devices),
                                unlist(expect$devices)),
                      sprintf("%s: devices %s", where,
                              paste(parallel$devices, collapse = ", ")))
    }
    if (!is.null(expect$merge_device)) {
      scenario_expect(identical(parallel$merge_device, expect$merge_device),
                      sprintf("%s: merge device %s", where,
                              parallel$merge_device))
    }
    if (!is.null(expect$template_is_model)) {
      same <- identical(reticulate::py_id(parallel$template),
                        reticulate::py_id(source))
      scenario_expect(same == expect$template_is_model,
                      sprintf("%s: template is the model: %s", where, same))
    }
    if (isTRUE(expect$weights_kept)) {
      scenario_expect(max_difference(state$api$weights(parallel$template), before) == 0,
                      sprintf("%s: the template's weights changed", where))
    }
    if (!is.null(expect$output_names)) {
      names <- scenario_names(parallel$output_names)
      scenario_expect(identical(names, unlist(expect$output_names)),
                      sprintf("%s: output names %s", where,
                              paste(names, collapse = ", ")))
    }
    if (!is.null(expect$split)) {
      split <- parallel$batch_split(expect$split[[1]])
      rows <- vapply(split, function(pair) as.integer(pair[[2]]), integer(1))
      scenario_expect(identical(rows, as.integer(unlist(expect$split[[2]]))),
                      sprintf("%s: batch split %s", where,
                              paste(rows, collapse = "/")))
    }
    entry
  },

  model_parallel = function(step, expect, entry, state, where) {
    expect <- scenario_expect_on(expect, scenario_keras_backend())
    args <- list()
    if (!is.null(step$devices)) args$devices <- scenario_devices(step$devices)
    if (!is.null(step$split)) {
      args$split <- if (is.list(step$split) &&
                        all(vapply(step$split, is.list, logical(1)))) {
        lapply(step$split, unlist)
      } else {
        unlist(step$split)
      }
    }
    if (!is.null(step$microbatches)) args$microbatches <- step$microbatches
    partitioned <- suppress_multigpu_warnings(
      do.call(model_parallel, c(list(state$model), args)))
    state$model <- partitioned
    state$template <- partitioned$template
    if (!is.null(expect$model_class)) {
      python_class <- sub(".*[.]", "", class(partitioned)[[1]])
      scenario_expect(identical(python_class, expect$model_class),
                      sprintf("%s: a %s", where, python_class))
    }
    if (!is.null(expect$stages)) {
      stages <- lapply(partitioned$stages, unlist)
      scenario_expect(identical(stages, lapply(expect$stages, unlist)),
                      sprintf("%s: stages %s", where,
                              paste(vapply(stages, paste, "", collapse = "+"),
                                    collapse = " | ")))
    }
    if (!is.null(expect$output_names)) {
      names <- scenario_names(partitioned$output_names)
      scenario_expect(identical(names, unlist(expect$output_names)),
                      sprintf("%s: output names %s", where,
                              paste(names, collapse = ", ")))
    }
    entry
  },

  mirrored_strategy = function(step, expect, entry, state, where) {
    state$strategy <- suppress_multigpu_warnings(
      mirrored_strategy(devices = scenario_devices(step$devices)))
    if (!is.null(expect$replicas)) {
      scenario_expect(state$strategy$num_replicas_in_sync == expect$replicas,
                      sprintf("%s: %s replicas", where,
                              state$strategy$num_replicas_in_sync))
    }
    entry
  },

  compile = function(step, expect, entry, state, where) {
    args <- c(list(state$model), state$api$compile_args(step))
    in_strategy_scope(state, function() do.call(compile, args))
    state$compile_step <- step
    entry
  },

  fit = function(step, expect, entry, state, where) {
    args <- list(epochs = step$epochs %||% 1, verbose = 0, shuffle = FALSE)
    if (!is.null(step$dataset)) {
      x <- scenario_dataset(step$dataset, state)
      y <- NULL
    } else {
      x <- state$x
      y <- state$y
      if (!is.null(step$batch_size)) args$batch_size <- step$batch_size
    }
    if (!is.null(step$validation_split)) {
      args$validation_split <- step$validation_split
    }
    if (isTRUE(step$checkpoint)) {
      args$callbacks <- checkpoint_callbacks(file.path(state$workdir,
                                                       "checkpoints"))
    }
    before <- state$api$weights(state$template)
    history <- do.call(fit, c(list(state$model, x, y), args))
    if (!is.null(expect$template_trained)) {
      changed <- max_difference(state$api$weights(state$template), before) > 0
      scenario_expect(changed == expect$template_trained,
                      sprintf("%s: the template's weights changed: %s", where,
                              changed))
    }
    metrics <- state$api$history_metrics(history)
    entry$history <- metrics[sort(names(metrics))]
    losses <- metrics$loss
    if (!is.null(expect$epochs_run)) {
      scenario_expect(length(losses) == expect$epochs_run,
                      sprintf("%s: %d epochs run", where, length(losses)))
    }
    if (isTRUE(expect$loss_decreases)) {
      scenario_expect(length(losses) >= 2 && utils::tail(losses, 1) < losses[[1]],
                      sprintf("%s: losses %s do not decrease", where,
                              paste(signif(losses, 5), collapse = ", ")))
    }
    if (!is.null(expect$keys)) {
      scenario_expect(identical(sort(names(metrics)), sort(unlist(expect$keys))),
                      sprintf("%s: history has %s", where,
                              paste(names(metrics), collapse = ", ")))
    }
    if (!is.null(expect$equals_reference)) {
      # A fresh model of the recipe, compiled and fit alike on one device.
      s <- state$scenario
      reference <- state$recipes$build(s$recipe, s$seed)
      do.call(compile, c(list(reference),
                         state$api$compile_args(state$compile_step)))
      args$callbacks <- NULL
      do.call(fit, c(list(reference, x, y), args))
      difference <- max_difference(state$api$weights(state$template),
                                   state$api$weights(reference))
      scenario_expect(difference <= scenario_tolerance(expect$equals_reference),
                      sprintf("%s: weights differ from the reference by %g",
                              where, difference))
    }
    entry
  },

  distributed_dataset = function(step, expect, entry, state, where) {
    scenario_dataset(step, state)
    entry
  },

  evaluate = function(step, expect, entry, state, where) {
    args <- list(state$model, state$x, state$y, verbose = 0)
    if (!is.null(step$batch_size)) args$batch_size <- step$batch_size
    result <- do.call(evaluate, args)
    values <- state$api$evaluate_metrics(result)
    entry$metrics <- values[sort(names(values))]
    if (!is.null(expect$keys)) {
      scenario_expect(identical(sort(names(values)), sort(unlist(expect$keys))),
                      sprintf("%s: evaluate gave %s", where,
                              paste(names(values), collapse = ", ")))
    }
    if (isTRUE(expect$finite)) {
      scenario_expect(all(is.finite(unlist(values))),
                      sprintf("%s: non-finite metrics", where))
    }
    entry
  },

  predict = function(step, expect, entry, state, where) {
    model <- if (identical(step$on, "template")) state$template else state$model
    predictions <- scenario_predict(model, state, step)
    entry$predictions <- flat_outputs(predictions)
    if (!is.null(expect$shape)) {
      wanted <- expect$shape
      if (!is.list(wanted[[1]])) wanted <- list(wanted)
      got <- lapply(flat_outputs(predictions), function(p) as.integer(dim(p)))
      scenario_expect(identical(got, lapply(wanted, function(s) as.integer(unlist(s)))),
                      sprintf("%s: prediction shapes %s", where,
                              paste(vapply(got, paste, "", collapse = "x"),
                                    collapse = ", ")))
    }
    if (isTRUE(expect$finite)) {
      scenario_expect(all(vapply(flat_outputs(predictions),
                                 function(p) all(is.finite(p)), logical(1))),
                      sprintf("%s: non-finite predictions", where))
    }
    if (!is.null(expect$equals_template)) {
      reference <- scenario_predict(state$template, state, step)
      difference <- max_difference(predictions, reference)
      scenario_expect(difference <= scenario_tolerance(expect$equals_template),
                      sprintf("%s: predictions differ from the template's by %g",
                              where, difference))
    }
    entry
  },

  save = function(step, expect, entry, state, where) {
    state$saved[[step$file]] <- scenario_predict(state$model, state)
    state$api$save_model(state$model, file.path(state$workdir, step$file))
    entry
  },

  reload = function(step, expect, entry, state, where) {
    loaded <- state$api$load_model(file.path(state$workdir, step$file))
    scenario_expect(!inherits(loaded, "multigpu.engines.tensorflow.replicate.ParallelModel"),
                    sprintf("%s: the reloaded model is a ParallelModel", where))
    predictions <- scenario_predict(loaded, state)
    entry$predictions <- flat_outputs(predictions)
    if (!is.null(expect$equals_before_save)) {
      difference <- max_difference(predictions, state$saved[[step$file]])
      scenario_expect(difference <= scenario_tolerance(expect$equals_before_save),
                      sprintf("%s: reloaded predictions differ by %g", where,
                              difference))
    }
    if (!is.null(expect$compiled)) {
      scenario_expect(identical(loaded$compiled, expect$compiled),
                      sprintf("%s: compiled is %s", where, loaded$compiled))
    }
    state$model <- state$template <- loaded
    entry
  },

  save_weights = function(step, expect, entry, state, where) {
    state$saved[[step$file]] <- scenario_predict(state$model, state)
    state$api$save_weights(state$model, file.path(state$workdir, step$file))
    entry
  },

  load_weights = function(step, expect, entry, state, where) {
    fresh <- state$recipes$build(state$scenario$recipe, step$seed)
    state$api$load_weights(fresh, file.path(state$workdir, step$file))
    predictions <- scenario_predict(fresh, state)
    entry$predictions <- flat_outputs(predictions)
    if (!is.null(expect$equals_saved)) {
      difference <- max_difference(predictions, state$saved[[step$file]])
      scenario_expect(difference <= scenario_tolerance(expect$equals_saved),
                      sprintf("%s: loaded weights predict %g away", where,
                              difference))
    }
    entry
  },

  make_or_restore_model = function(step, expect, entry, state, where) {
    built <- FALSE
    previous <- state$model
    s <- state$scenario
    build_fn <- function() {
      built <<- TRUE
      model <- state$recipes$build(s$recipe, s$seed)
      do.call(compile, c(list(model), state$api$compile_args(step$compile)))
      model
    }
    directory <- file.path(state$workdir, "checkpoints")
    model <- in_strategy_scope(state, function() {
      make_or_restore_model(directory, build_fn)
    })
    if (is.null(state$record$initial_weights) && built) {
      state$record$initial_weights <- state$api$weights(model)
    }
    if (!is.null(expect$restored)) {
      scenario_expect(!built == expect$restored,
                      sprintf("%s: restored is %s", where, !built))
      if (isTRUE(expect$restored) && !is.null(previous)) {
        difference <- max_difference(state$api$weights(model),
                                     state$api$weights(previous))
        scenario_expect(difference <= 1e-7,
                        sprintf("%s: restored weights differ by %g", where,
                                difference))
      }
    }
    state$model <- state$template <- model
    entry
  },

  checkpoint_callbacks = function(step, expect, entry, state, where) {
    checkpoint_callbacks(file.path(state$workdir, "checkpoints"),
                         save_freq = step$save_freq)
    entry
  },

  virtual_devices = function(step, expect, entry, state, where) {
    virtual_devices(step$n)
    entry
  }
)

#' For the Python parity check: runs a scenario and hands its record to
#' Python (tests/scenarios/recipes.py keeps it for the pytest process).
run_scenario_for_python <- function(path, workdir, api = "plain") {
  api <- switch(api, plain = scenario_api_plain(), keras3 = scenario_api_keras3())
  record <- suppress_multigpu_warnings(run_scenario(path, workdir, api))
  name <- sub("[.]json$", "", basename(path))
  scenario_recipes(dirname(normalizePath(path)))$store_r_record(name, record)
  invisible(NULL)
}
