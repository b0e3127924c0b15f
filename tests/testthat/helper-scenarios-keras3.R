# The keras3 mode of the scenario runner (helper-scenarios.R): the same
# scenario files, written as a keras3 user writes them. With keras3 attached,
# compile()/fit()/evaluate()/predict() reach keras3's methods (registered for
# keras.src.models.model.Model, before multigpu's for
# keras.src.trainers.trainer.Trainer in a model's class vector); optimizers,
# losses and metrics come from keras3's constructors, weights from
# get_weights(), weight files from save_model_weights()/load_model_weights(),
# saved models are read back with load_model(), and the data of a
# distributed_dataset() is a tfdatasets dataset. multigpu's own functions
# (multi_gpu_model(), mirrored_strategy(), checkpoint_callbacks(), ...) and
# the models of tests/scenarios/recipes.py stay the same.
#
# Attaching keras3 changes S3 dispatch for the whole R session, so this mode
# runs in an R of its own: tests/python/test_scenario_parity_keras3.py embeds
# one (see tests/python/support/embedded_r.py). This file only defines functions;
# testthat sources it with the other helpers.

#' The keras3 API of the scenario runner; keras3 and tfdatasets attached.
scenario_api_keras3 <- function() {
  for (package in c("keras3", "tfdatasets")) {
    if (!paste0("package:", package) %in% search()) {
      stop("The keras3 scenario mode needs library(", package, ") attached ",
           "first, as keras3 users have it.", call. = FALSE)
    }
  }
  # The point of this mode: keras3's methods serve the models.
  for (generic in c("compile", "fit", "evaluate", "predict")) {
    method <- utils::getS3method(generic, "keras.src.models.model.Model",
                                 optional = TRUE)
    if (is.null(method) ||
        !identical(environmentName(environment(method)), "keras3")) {
      stop(generic, "() has no keras3 method for Keras models here.",
           call. = FALSE)
    }
  }
  plain <- scenario_api_plain()
  utils::modifyList(plain, list(
    name = "keras3",
    compile_args = scenario_compile_args_keras3,
    weights = function(model) keras3::get_weights(model),
    dataset_data = function(state) {
      list(tfdatasets::tensor_slices_dataset(list(state$x, state$y)))
    },
    history_metrics = function(history) {
      if (inherits(history, "multigpu_training_history")) {
        stop("fit() reached multigpu's method, not keras3's.", call. = FALSE)
      }
      history$metrics
    },
    evaluate_metrics = function(result) {
      # keras3's evaluate() gives a named list (or a bare number for a
      # loss alone): as the plain runner's record has it, one per name.
      if (!is.list(result) && is.null(names(result))) {
        result <- list(loss = result)
      }
      lapply(as.list(result), as.numeric)
    },
    # keras3 has no HDF5 writer of its own (its save_model() passes the
    # model to keras.saving.save_model(), which writes a ParallelModel
    # itself rather than its template), so the file is multigpu's
    # save_model_hdf5(), read back with keras3's load_model().
    save_model = save_model_hdf5,
    load_model = function(path) keras3::load_model(path),
    save_weights = function(model, path) keras3::save_model_weights(model, path),
    load_weights = function(model, path) keras3::load_model_weights(model, path),
    expected_error = function(error) {
      caught <- plain$expected_error(error)
      if (!is.null(caught)) return(caught)
      # keras3's methods call Keras directly: a Python exception raised
      # there reaches R as reticulate's condition (class
      # python.builtin.ValueError, ...), its message the core's, worded for
      # Python since multigpu's bridge (which asks for R wording) was not on
      # the way.
      python_classes <- paste0("python.builtin.", names(scenario_error_classes))
      matched <- intersect(class(error), python_classes)
      if (!length(matched)) return(NULL)
      last <- reticulate::py_last_error()
      message <- last$value %||% sub("\nRun `reticulate::py_last_error\\(\\)`.*$",
                                     "", conditionMessage(error))
      list(class = sub("^python[.]builtin[.]", "", matched[[1]]),
           r_class = paste(class(error), collapse = "/"),
           message = sub("\n+$", "", message), from_python = TRUE,
           rendered = "python")
    }
  ))
}

# A Keras name as keras3 spells its constructor: optimizer_sgd(),
# loss_mean_squared_error(), metric_mean_absolute_error().
scenario_keras3_constructor <- function(prefix, name) {
  name <- tolower(name)
  constructor <- paste0(prefix, "_", name)
  if (!exists(constructor, envir = asNamespace("keras3"), inherits = FALSE)) {
    return(NULL)
  }
  get(constructor, envir = asNamespace("keras3"))
}

scenario_optimizer_keras3 <- function(spec) {
  if (is.null(spec)) return("rmsprop")
  if (is.character(spec)) return(spec)
  constructor <- scenario_keras3_constructor("optimizer", spec$class)
  if (is.null(constructor)) stop("keras3 has no optimizer_", tolower(spec$class))
  do.call(constructor, spec[names(spec) != "class"])
}

# A loss named in full is keras3's loss object (loss_mean_squared_error());
# an alias such as "mse" stays the string a user writes
# (siamese_outputs checks that files saved with one load compiled).
scenario_loss_keras3 <- function(spec) {
  if (is.list(spec)) return(lapply(spec, scenario_loss_keras3))
  constructor <- scenario_keras3_constructor("loss", spec)
  if (is.null(constructor)) spec else constructor()
}

# Metric names as metric objects, keeping the scenario's name so that the
# history's keys are those of the Python run (metric_mean_absolute_error(
# name = "mae")). "accuracy" is sparse categorical accuracy: every scenario
# with it has integer class labels.
scenario_metric_names_keras3 <- c(mae = "mean_absolute_error",
                                  mse = "mean_squared_error",
                                  accuracy = "sparse_categorical_accuracy")

scenario_metrics_keras3 <- function(spec) {
  if (is.null(spec)) return(NULL)
  if (!is.null(names(spec))) return(lapply(spec, scenario_metrics_keras3))
  lapply(unlist(spec), function(name) {
    full <- if (name %in% names(scenario_metric_names_keras3)) {
      scenario_metric_names_keras3[[name]]
    } else {
      name
    }
    constructor <- scenario_keras3_constructor("metric", full)
    if (is.null(constructor)) stop("keras3 has no metric_", full)
    constructor(name = name)
  })
}

scenario_compile_args_keras3 <- function(spec) {
  args <- list(optimizer = scenario_optimizer_keras3(spec$optimizer),
               loss = scenario_loss_keras3(spec$loss))
  if (!is.null(spec$metrics)) args$metrics <- scenario_metrics_keras3(spec$metrics)
  args
}
