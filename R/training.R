# keras3's compile(), fit(), evaluate() and predict() train multigpu's models
# (keras3 registers them for keras.src.models.model.Model). A parallel or
# template-backed model's own Python class comes first in its class vector,
# so these methods run first and only wrap keras3's in the bridge: the
# core's errors and warnings reach R as classed conditions, in R spelling.

#' @exportS3Method compile multigpu.engines.template.TemplateBacked
compile.multigpu.engines.template.TemplateBacked <- function(object, ...) {
  invisible(with_python(NextMethod()))
}

#' @exportS3Method fit multigpu.engines.template.TemplateBacked
fit.multigpu.engines.template.TemplateBacked <- function(object, x = NULL, ..., shuffle) {
  # Keras ignores `shuffle` for a dataset (shuffle it when building it) and
  # warns about keras3's default TRUE; unless asked, send FALSE.
  if (missing(shuffle) && is_dataset(x)) {
    return(invisible(with_python(NextMethod(shuffle = FALSE))))
  }
  invisible(with_python(NextMethod()))
}

#' @exportS3Method evaluate multigpu.engines.template.TemplateBacked
evaluate.multigpu.engines.template.TemplateBacked <- function(object, ...) {
  with_python(NextMethod())
}

#' @exportS3Method predict multigpu.engines.template.TemplateBacked
predict.multigpu.engines.template.TemplateBacked <- function(object, ...) {
  with_python(NextMethod())
}
