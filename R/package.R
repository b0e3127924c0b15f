#' multigpu: multi-device Keras training in one call
#'
#' An R interface to the multigpu Python package, which brings Keras's
#' `multi_gpu_model()` back for TensorFlow 2.21 and Keras 3 and adds
#' mirrored-strategy helpers. Models are built and trained with keras3.
#'
#' * Data parallelism in one call: [multi_gpu_model()].
#' * Simulated devices on a machine without GPUs: [virtual_devices()]
#'   (call it before building a model), [available_devices()].
#' * Mirrored strategies and their helpers: [mirrored_strategy()],
#'   [distributed_dataset()], [make_or_restore_model()],
#'   [checkpoint_callbacks()].
#' * Saving: [save_model_hdf5()], [save_model_weights_hdf5()],
#'   [load_model_hdf5()], [load_model_weights_hdf5()].
#' * The Python side: [multigpu_config()], [install_multigpu()],
#'   [multigpu-conditions].
#'
#' keras3's `compile()`, `fit()`, `evaluate()` and `predict()` train
#' multigpu's models; this package re-exports the same generics, so
#' attaching both masks nothing. Every decision is made by the Python core;
#' R coerces arguments, calls, and turns Python exceptions into classed R
#' conditions.
#'
#' @keywords internal
"_PACKAGE"

#' @importFrom magrittr %>%
#' @export
magrittr::`%>%`

#' @importFrom keras3 compile
#' @export
keras3::compile

#' @importFrom keras3 fit
#' @export
keras3::fit

#' @importFrom tensorflow evaluate
#' @export
tensorflow::evaluate

#' @importFrom stats predict
NULL

#' @importFrom rlang %||% caller_arg caller_env
NULL

.globals <- new.env(parent = emptyenv())

.onLoad <- function(libname, pkgname) {
  # TensorFlow's C++ start-up messages: errors only, unless the user chose.
  if (is.na(Sys.getenv("TF_CPP_MIN_LOG_LEVEL", unset = NA))) {
    Sys.setenv(TF_CPP_MIN_LOG_LEVEL = "2")
  }
  # As keras3 forwards KERAS_PYTHON.
  python <- Sys.getenv("MULTIGPU_PYTHON", unset = NA)
  if (!is.na(python)) Sys.setenv(RETICULATE_PYTHON = python)
  declare_python_requirements()
  # Delayed: virtual_devices() must run before TensorFlow configures its
  # devices. An existing r-multigpu environment (install_multigpu()) is
  # reticulate's choice when nothing else chose a Python.
  .globals$core <- reticulate::import(
    "multigpu", delay_load = list(environment = "r-multigpu"))
}
