# keras3's compile(), fit(), evaluate() and predict() train multigpu's models
# (keras3 registers them for keras.src.models.model.Model). A parallel or
# template-backed model's own Python class comes first in its class vector,
# so these methods run first: they refuse what R alone sees in the arguments
# (check_keras3_args()), then call keras3's method in the bridge, so that the
# core's errors and warnings reach R as classed conditions, in R spelling.

#' @exportS3Method compile multigpu.engines.template.TemplateBacked
compile.multigpu.engines.template.TemplateBacked <- function(object, ...) {
  check_keras3_args("compile", ...)
  invisible(with_python(NextMethod()))
}

#' @exportS3Method fit multigpu.engines.template.TemplateBacked
fit.multigpu.engines.template.TemplateBacked <- function(object, x = NULL, y = NULL, ...,
                                                         shuffle) {
  check_keras3_args("fit", x = x, y = y, ..., shuffle = if (!missing(shuffle)) shuffle)
  # Keras ignores `shuffle` for a dataset (shuffle it when building it) and
  # warns about keras3's default TRUE; unless asked, send FALSE.
  if (missing(shuffle) && is_dataset(x)) {
    return(invisible(with_python(NextMethod(shuffle = FALSE))))
  }
  invisible(with_python(NextMethod()))
}

#' @exportS3Method evaluate multigpu.engines.template.TemplateBacked
evaluate.multigpu.engines.template.TemplateBacked <- function(object, x = NULL, y = NULL, ...) {
  check_keras3_args("evaluate", x = x, y = y, ...)
  with_python(NextMethod())
}

#' @exportS3Method predict multigpu.engines.template.TemplateBacked
predict.multigpu.engines.template.TemplateBacked <- function(object, x = NULL, ...) {
  check_keras3_args("predict", x = x, ...)
  with_python(NextMethod())
}

# keras3's whole-number arguments, which it passes through as.integer(): 2.5
# would train with 2 and NA reach Keras as a missing value.
keras3_counts <- c("batch_size", "epochs", "initial_epoch", "steps",
                   "steps_per_epoch", "steps_per_execution",
                   "validation_batch_size", "validation_freq",
                   "validation_steps")

#' Refuses what R alone sees in the arguments of keras3's method `fn`, before
#' keras3 converts them: data it cannot train on (check_keras3_data()),
#' counts that are no whole numbers, and an NA that reticulate would send as
#' `TRUE` (or as the string "NA", or NaN).
#' @param ... The arguments given to the method, named as keras3 names them.
#' @noRd
check_keras3_args <- function(fn, ..., call = caller_env()) {
  args <- list(...)
  for (name in intersect(names(args), c("x", "y", "sample_weight"))) {
    check_keras3_data(args[[name]], name, call = call)
  }
  check_validation_data(args[["validation_data"]], "validation_data", call = call)
  for (name in intersect(names(args), keras3_counts)) {
    as_count(args[[name]], name, call = call)
  }
  as_flag(args[["shuffle"]], "shuffle", call = call)
  check_no_na(args, fn, call = call)
}

#' Whether `x` is a `tf.data` dataset.
#' @noRd
is_dataset <- function(x) {
  inherits(x, "tensorflow.python.data.ops.dataset_ops.DatasetV2")
}
