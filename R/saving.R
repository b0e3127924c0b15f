#' Save and load models and weights in HDF5 files
#'
#' `save_model_hdf5()` writes a model (architecture, weights and, when
#' compiled, the optimizer) to a legacy Keras HDF5 file; `load_model_hdf5()`
#' reads one back. Files written by `save_model_hdf5()` load compiled with
#' keras3's `load_model()` too, whatever loss and metric
#' aliases (`"mse"`, `"mae"`) `compile()` was given. `save_model_weights_hdf5()` and `load_model_weights_hdf5()`
#' write and read the weights alone (Keras 3 requires the name to end in
#' `.weights.h5`).
#'
#' @section Parallel models:
#' Given a model returned by [multi_gpu_model()], these functions act on its
#' template (the model whose weights the replicas share), as the original
#' documentation asks users to do by hand: the file holds a plain Keras model
#' that loads with `load_model_hdf5()` on any machine, with or without
#' multigpu and whatever its devices. So `parallel_model |>
#' save_model_hdf5("m.h5")` and `model |> save_model_hdf5("m.h5")` write the
#' same file. To train the loaded model on several devices again, pass it to
#' [multi_gpu_model()]. Weights saved from either load into either.
#'
#' @param object A Keras model, or a model returned by [multi_gpu_model()].
#' @param filepath Path of the file: ending in `.h5` or `.hdf5` for models,
#'   in `.weights.h5` for weights.
#' @param overwrite `TRUE` (default) to replace an existing file; `FALSE` to
#'   signal an error instead.
#' @param include_optimizer `TRUE` to save the optimizer's state too.
#' @param custom_objects A named list of custom classes or functions the
#'   model uses, or `NULL`.
#' @param compile `TRUE` to compile the loaded model as it was saved.
#' @param skip_mismatch `TRUE` to skip layers whose weights do not match.
#' @returns The save functions and `load_model_weights_hdf5()` return `object`
#'   invisibly (so they pipe); `load_model_hdf5()` returns the loaded Keras
#'   model.
#' @family saving
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(1)
#' parallel_model <- model |> multi_gpu_model(gpus = 2)
#' file <- tempfile(fileext = ".h5")
#' parallel_model |> save_model_hdf5(file)   # writes the template
#' restored <- load_model_hdf5(file)
#' weights <- tempfile(fileext = ".weights.h5")
#' parallel_model |> save_model_weights_hdf5(weights)
#' model |> load_model_weights_hdf5(weights)
#' # keras3's load_model() reads the same file
#' load_model(file)
save_model_hdf5 <- function(object, filepath, overwrite = TRUE,
                            include_optimizer = TRUE) {
  check_model(object)
  filepath <- as_hdf5_path(filepath, c(".h5", ".hdf5"), overwrite)
  call_core("save_model", object, filepath, overwrite = TRUE,
            include_optimizer = as_flag(include_optimizer))
  invisible(object)
}

#' @rdname save_model_hdf5
#' @export
save_model_weights_hdf5 <- function(object, filepath, overwrite = TRUE) {
  check_model(object)
  filepath <- as_hdf5_path(filepath, ".weights.h5", overwrite)
  with_python(object$save_weights(filepath, overwrite = TRUE))
  invisible(object)
}

#' @rdname save_model_hdf5
#' @export
load_model_hdf5 <- function(filepath, custom_objects = NULL, compile = TRUE) {
  call_core("load_model", as_path(filepath),
            custom_objects = as_custom_objects(custom_objects),
            compile = as_flag(compile))
}

#' @rdname save_model_hdf5
#' @export
load_model_weights_hdf5 <- function(object, filepath, skip_mismatch = FALSE) {
  check_model(object)
  with_python(object$load_weights(as_path(filepath),
                                  skip_mismatch = as_flag(skip_mismatch)))
  invisible(object)
}

#' A path to save to: checked for the extension Keras needs and, without
#' `overwrite`, for an existing file (Keras would prompt on the console).
#' @noRd
as_hdf5_path <- function(filepath, extensions, overwrite,
                         arg = "filepath", call = caller_env()) {
  filepath <- as_path(filepath, arg, call = call)
  overwrite <- as_flag(overwrite, "overwrite", call = call)
  if (!any(endsWith(tolower(filepath), extensions))) {
    multigpu_abort(sprintf(
      "`%s` must end in %s, not %s. Use e.g. %s = \"%s\".",
      arg, paste(sprintf("\"%s\"", extensions), collapse = " or "),
      describe(filepath), arg,
      paste0(sub("\\.[^.]*$", "", basename(filepath)), extensions[[1]])
    ), call = call)
  }
  if (isFALSE(overwrite) && file.exists(filepath)) {
    multigpu_abort(sprintf(
      "`%s` already exists: %s. Use overwrite = TRUE to replace it, or another path.",
      arg, filepath
    ), class = "multigpu_os_error", call = call)
  }
  filepath
}
