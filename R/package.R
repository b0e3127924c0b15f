#' multigpu: multi-device Keras training in one call
#'
#' An R interface to the multigpu Python package, which brings Keras's
#' `multi_gpu_model()` back for TensorFlow 2.21 and Keras 3 and adds
#' mirrored-strategy helpers.
#'
#' * Data parallelism in one call: [multi_gpu_model()].
#' * Simulated devices on a machine without GPUs: [virtual_devices()]
#'   (call it before building a model, after `library(keras3)` and
#'   `library(multigpu)` in either order), [available_devices()].
#' * With keras3 attached, its `compile()`, `fit()`, `evaluate()` and
#'   `predict()` train multigpu's models too; this package exports the same
#'   generics (tensorflow's `evaluate()` when tensorflow is installed), so
#'   attaching both masks nothing.
#' * Mirrored strategies and their helpers: [mirrored_strategy()],
#'   [distributed_dataset()], [make_or_restore_model()],
#'   [checkpoint_callbacks()].
#' * Training without the keras3 package: [compile()][compile.keras.src.trainers.trainer.Trainer],
#'   [fit()][fit.keras.src.trainers.trainer.Trainer],
#'   [evaluate()][evaluate.keras.src.trainers.trainer.Trainer],
#'   [predict()][predict.keras.src.trainers.trainer.Trainer], and
#'   [plot()][plot.multigpu_training_history] of the training history.
#' * Saving: [save_model_hdf5()], [save_model_weights_hdf5()],
#'   [load_model_hdf5()], [load_model_weights_hdf5()].
#' * The Python side: [install_multigpu()], [multigpu_config()],
#'   [multigpu-conditions].
#'
#' Every decision is made by the Python core; R coerces arguments (numbers
#' to integers, vectors to lists), calls, and turns Python exceptions into
#' classed R conditions.
#'
#' @keywords internal
"_PACKAGE"

#' @importFrom magrittr %>%
#' @export
magrittr::`%>%`

#' @importFrom generics compile
#' @export
generics::compile

#' @importFrom generics fit
#' @export
generics::fit

# evaluate() is the generic of the tensorflow package when it is installed
# (see use_tensorflow_evaluate()), else generics'.
#' @importFrom generics evaluate
#' @export
generics::evaluate

#' @importFrom stats predict
NULL

.globals <- new.env(parent = emptyenv())
.globals$status <- list()

.onLoad <- function(libname, pkgname) {
  # TensorFlow's C++ start-up messages: errors only, unless the user chose.
  if (is.na(Sys.getenv("TF_CPP_MIN_LOG_LEVEL", unset = NA))) {
    Sys.setenv(TF_CPP_MIN_LOG_LEVEL = "2")
  }
  use_tensorflow_evaluate()
  select_python()
  declare_python_requirements()
  # The import does not start Python: virtual_devices() must be able to run
  # before TensorFlow initialises its devices.
  .globals$core <- reticulate::import("multigpu", delay_load = TRUE)
}

#' Export tensorflow's `evaluate()` generic when tensorflow is installed.
#'
#' keras3 re-exports tensorflow's `evaluate()`, this package generics'
#' (tensorflow is not a dependency): two different functions of one name, so
#' whichever package is attached last would mask the other's, and methods
#' registered on one generic are not found through the other. When tensorflow
#' is installed, the namespace binds `evaluate` to tensorflow's generic
#' before its exports are fixed (`.onLoad` runs first), so both packages
#' export the same function, and the methods here are registered on it too.
#' @noRd
use_tensorflow_evaluate <- function(ns = topenv(parent.frame())) {
  if (!requireNamespace("tensorflow", quietly = TRUE)) return(invisible(FALSE))
  generic <- getExportedValue("tensorflow", "evaluate")
  assign("evaluate", generic, envir = ns)
  registerS3method("evaluate", "keras.src.trainers.trainer.Trainer",
                   evaluate.keras.src.trainers.trainer.Trainer,
                   envir = asNamespace("tensorflow"))
  registerS3method("evaluate", "multigpu.template.TemplateBacked",
                   evaluate.multigpu.template.TemplateBacked,
                   envir = asNamespace("tensorflow"))
  invisible(TRUE)
}
