# compile(), fit(), evaluate() and predict() for Keras models, without the
# keras3 package. The methods are registered for the Python class
# `keras.src.trainers.trainer.Trainer`, which comes *after*
# `keras.src.models.model.Model` in a model's class vector: when keras3 is
# loaded, its methods (registered for `Model`) are found first and used, and
# these serve only when it is not. Nothing is overwritten either way.

#' Configure a model for training
#'
#' The `compile()` of the generics package, for Keras models (including
#' those from [multi_gpu_model()]) when the keras3 package is not in use.
#' The model is modified in place.
#'
#' @param object A Keras model.
#' @param optimizer An optimizer name such as `"rmsprop"` or `"adam"`, or a
#'   Keras optimizer object.
#' @param loss A loss name such as `"sparse_categorical_crossentropy"`, a
#'   loss object, or a named list with one per output.
#' @param metrics A character vector or list of metrics (names or objects);
#'   one name is sent as a list, as Keras requires. A named list gives
#'   metrics per output.
#' @param ... Further arguments of Keras `compile()`, such as
#'   `loss_weights`, `weighted_metrics` or `run_eagerly`.
#' @param steps_per_execution Batches per compiled call, a whole number, or
#'   `NULL` for the Keras default.
#' @param jit_compile `NULL` for the Keras default, or `TRUE`/`FALSE`. (A
#'   model from [multi_gpu_model()] always runs without XLA, which would
#'   fuse its replicas onto one device.)
#' @returns `object`, invisibly.
#' @family model training
#' @method compile keras.src.trainers.trainer.Trainer
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(3, activation = "softmax")
#' # keras3's compile() when keras3 is loaded, this one otherwise: same call
#' model |> compile(optimizer = "adam",
#'                  loss = "sparse_categorical_crossentropy",
#'                  metrics = "accuracy")
compile.keras.src.trainers.trainer.Trainer <- function(
    object, optimizer = "rmsprop", loss = NULL, metrics = NULL, ...,
    steps_per_execution = NULL, jit_compile = NULL) {
  args <- list(optimizer = optimizer, loss = loss,
               metrics = as_py_list(metrics), ...,
               steps_per_execution = as_count(steps_per_execution),
               jit_compile = as_flag(jit_compile))
  call_method(object, "compile", args,
              optional = c("steps_per_execution", "jit_compile"))
  invisible(object)
}

#' Train a model
#'
#' The `fit()` of the generics package, for Keras models (including those
#' from [multi_gpu_model()] and models created under a
#' [mirrored_strategy()]) when the keras3 package is not in use. Arguments
#' are coerced the R way: whole numbers such as `epochs = 5` become
#' integers, R double arrays become float32 arrays, factors become 0-based
#' class codes, and `validation_data = list(x_val, y_val)` becomes the tuple
#' Keras expects.
#'
#' @param object A Keras model, compiled.
#' @param x Inputs: an R array or matrix (samples first), a list of arrays
#'   (several inputs), a `tf$data$Dataset` such as one from
#'   [distributed_dataset()], or another Python object Keras accepts.
#' @param y Targets, like `x`; `NULL` when `x` is a dataset.
#' @param ... Further arguments of Keras `fit()`.
#' @param batch_size Samples per step (the *global* batch, split between the
#'   devices), a whole number; `NULL` for 32, or for datasets.
#' @param epochs Number of epochs to train, a whole number.
#' @param verbose `"auto"` (1, or 2 while knitr renders a document), `0`
#'   (silent), `1` (progress bar) or `2` (one line per epoch); `TRUE` and
#'   `FALSE` mean 1 and 0. The default comes from
#'   `getOption("keras.verbose")`, as in keras3.
#' @param callbacks A list of Keras callbacks (or one callback), such as
#'   those from [checkpoint_callbacks()].
#' @param validation_split Fraction of the training data held out for
#'   validation.
#' @param validation_data `list(x_val, y_val)` or a dataset to validate on
#'   after each epoch.
#' @param shuffle `TRUE` to shuffle the training data before each epoch
#'   (arrays only: shuffle a dataset when building it, e.g.
#'   `distributed_dataset(shuffle = TRUE)`).
#' @param class_weight A named list or vector of weights, named by 0-based
#'   class index, e.g. `c("0" = 1, "1" = 5)`.
#' @param sample_weight Weights of the training samples.
#' @param initial_epoch The epoch to start at, 1-based as in keras3 (use it
#'   to resume a run: `epochs` is the epoch to stop after).
#' @param steps_per_epoch,validation_steps,validation_batch_size,validation_freq
#'   Whole numbers, or `NULL` for the Keras default.
#' @returns A training history (class `multigpu_training_history`, also
#'   `keras_training_history`), invisibly: `$metrics` holds one numeric
#'   vector per metric (`loss`, `val_loss`, ...), `$epochs` the epoch
#'   numbers and `$params` what Keras reported. It prints as a table and has
#'   [plot()][plot.multigpu_training_history] and `as.data.frame()` methods.
#' @family model training
#' @method fit keras.src.trainers.trainer.Trainer
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(3, activation = "softmax")
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' parallel_model |> compile(loss = "sparse_categorical_crossentropy",
#'                           metrics = "accuracy")
#' x <- as.matrix(iris[, 1:4])
#' y <- as.integer(iris$Species) - 1L   # classes 0, 1, 2 (without keras3, a factor works too)
#' history <- parallel_model |>
#'   fit(x, y, epochs = 3, batch_size = 32, verbose = 0, validation_split = 0.2)
#' history
#' plot(history)
fit.keras.src.trainers.trainer.Trainer <- function(
    object, x = NULL, y = NULL, ..., batch_size = NULL, epochs = 1L,
    verbose = getOption("keras.verbose", default = "auto"), callbacks = NULL,
    validation_split = 0, validation_data = NULL, shuffle = TRUE,
    class_weight = NULL, sample_weight = NULL, initial_epoch = 1L,
    steps_per_epoch = NULL, validation_steps = NULL,
    validation_batch_size = NULL, validation_freq = 1L) {
  dtype <- input_dtype(object)
  args <- list(
    x = as_model_data(x, dtype), y = as_model_data(y, dtype), ...,
    batch_size = as_count(batch_size),
    epochs = as_count(epochs, null_ok = FALSE),
    verbose = as_verbose(verbose),
    callbacks = as_callbacks(callbacks),
    validation_split = as_fraction(validation_split),
    validation_data = as_validation_data(validation_data, dtype),
    # Keras ignores `shuffle` for a dataset (shuffle it when building it)
    # and warns about its default TRUE; unless asked, send FALSE.
    shuffle = if (missing(shuffle) && is_dataset(x)) FALSE else as_flag(shuffle),
    class_weight = as_class_weight(class_weight),
    sample_weight = as_model_data(sample_weight, dtype),
    initial_epoch = as_epoch_index(initial_epoch),
    steps_per_epoch = as_count(steps_per_epoch),
    validation_steps = as_count(validation_steps),
    validation_batch_size = as_count(validation_batch_size),
    validation_freq = as_count(validation_freq, null_ok = FALSE)
  )
  history <- call_method(object, "fit", args)
  invisible(as_training_history(history))
}

#' Evaluate a model
#'
#' `evaluate()` for Keras models when the keras3 package is not in use, with
#' keras3's arguments: `model |> evaluate(x_test, y_test)`. The generic is
#' tensorflow's (the one keras3 exports) when the tensorflow package is
#' installed, else that of the generics package, whose first argument is
#' also called `x`: there pass the test inputs by position.
#'
#' @param object A Keras model, compiled.
#' @param x Test inputs: an R array, a list of arrays, or a dataset.
#' @param y Test targets, like `x`; `NULL` when `x` is a dataset.
#' @param ... Further arguments of Keras `evaluate()`.
#' @param batch_size Samples per step, a whole number, or `NULL`.
#' @param verbose As in [fit()][fit.keras.src.trainers.trainer.Trainer].
#' @param sample_weight Weights of the test samples.
#' @param steps Number of batches to evaluate, or `NULL` for all.
#' @param callbacks A list of Keras callbacks.
#' @returns A named list: the loss and every metric, e.g.
#'   `list(loss = 0.12, accuracy = 0.97)`.
#' @family model training
#' @method evaluate keras.src.trainers.trainer.Trainer
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(1)
#' model |> compile(loss = "mse", metrics = "mae")
#' x <- matrix(runif(64), ncol = 4)
#' model |> evaluate(x, rowSums(x), verbose = 0)
evaluate.keras.src.trainers.trainer.Trainer <- function(
    object, x = NULL, y = NULL, ..., batch_size = NULL,
    verbose = getOption("keras.verbose", default = "auto"),
    sample_weight = NULL, steps = NULL, callbacks = NULL) {
  dtype <- input_dtype(object)
  args <- list(
    x = as_model_data(x, dtype), y = as_model_data(y, dtype), ...,
    batch_size = as_count(batch_size), verbose = as_verbose(verbose),
    sample_weight = as_model_data(sample_weight, dtype),
    steps = as_count(steps), callbacks = as_callbacks(callbacks),
    return_dict = TRUE
  )
  call_method(object, "evaluate", args)
}

#' Predict with a model
#'
#' The `predict()` of the stats package, for Keras models when the keras3
#' package is not in use.
#'
#' @param object A Keras model.
#' @param x Inputs: an R array, a list of arrays, or a dataset.
#' @param ... Further arguments of Keras `predict()`.
#' @param batch_size Samples per step, a whole number, or `NULL`.
#' @param verbose As in [fit()][fit.keras.src.trainers.trainer.Trainer].
#' @param steps Number of batches to predict, or `NULL` for all.
#' @param callbacks A list of Keras callbacks.
#' @returns An R array of predictions (samples first), or a list of arrays
#'   for a model with several outputs.
#' @family model training
#' @method predict keras.src.trainers.trainer.Trainer
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(2)
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' parallel_model |> predict(matrix(runif(20), ncol = 4), verbose = 0)
predict.keras.src.trainers.trainer.Trainer <- function(
    object, x, ..., batch_size = NULL,
    verbose = getOption("keras.verbose", default = "auto"), steps = NULL,
    callbacks = NULL) {
  args <- list(
    x = as_model_data(x, input_dtype(object)), ...,
    batch_size = as_count(batch_size), verbose = as_verbose(verbose),
    steps = as_count(steps), callbacks = as_callbacks(callbacks)
  )
  call_method(object, "predict", args)
}

# multigpu's own models, whoever trains them: keras3's methods when keras3 is
# loaded (registered for `keras.src.models.model.Model`, found next), else
# the methods above. The model's Python class comes first in its class
# vector, so these run first and only wrap the next method in the bridge:
# the core's errors and warnings reach R as classed conditions, in R
# spelling, under keras3's methods too.

#' @exportS3Method compile multigpu.template.TemplateBacked
compile.multigpu.template.TemplateBacked <- function(object, ...) {
  with_python(NextMethod())
}

#' @exportS3Method fit multigpu.template.TemplateBacked
fit.multigpu.template.TemplateBacked <- function(object, ...) {
  with_python(NextMethod())
}

#' @exportS3Method evaluate multigpu.template.TemplateBacked
evaluate.multigpu.template.TemplateBacked <- function(object, ...) {
  with_python(NextMethod())
}

#' @exportS3Method predict multigpu.template.TemplateBacked
predict.multigpu.template.TemplateBacked <- function(object, ...) {
  with_python(NextMethod())
}
