#' Simulate several devices on one
#'
#' Splits the first physical device of a type into `n` logical devices, so
#' multi-device code ([multi_gpu_model()], [mirrored_strategy()]) runs on a
#' machine with one CPU and no GPU. TensorFlow fixes its devices when it
#' starts, so call this first thing, right after `library(multigpu)`, before
#' building a model or running anything in TensorFlow. Calling it again with
#' the same `n` is harmless; a different `n` once TensorFlow has started
#' signals a `multigpu_runtime_error` (restart R to change it).
#'
#' @param n Number of logical devices, a whole number >= 1.
#' @param device_type `"CPU"` (default) or `"GPU"`.
#' @param memory_limit For `"GPU"`, the memory of each logical GPU in MiB
#'   (required); must be `NULL` for `"CPU"`.
#' @param threads For `"CPU"`, the compute threads of each logical device, in
#'   a pool of its own as separate devices have. `NULL` (default) gives each
#'   device its share of the cores (at least 1), or the intra-op threads the
#'   program already set; `0` keeps TensorFlow's one pool shared by all
#'   devices.
#' @returns The names of the logical devices, e.g.
#'   `c("/device:CPU:0", "/device:CPU:1")`.
#' @family devices
#' @export
#' @examplesIf multigpu::is_multigpu_available()
#' library(multigpu)
#' virtual_devices(2)
#' available_devices()
virtual_devices <- function(n, device_type = "CPU", memory_limit = NULL,
                            threads = NULL) {
  call_core("virtual_devices", as_count(n, null_ok = FALSE),
            device_type = device_type,
            memory_limit = as_count(memory_limit),
            threads = as_count(threads))
}

#' Devices TensorFlow can place work on
#'
#' Starts TensorFlow if it has not started (after which [virtual_devices()]
#' can no longer change the devices).
#'
#' @returns A list with `GPU` and `CPU`, each a character vector of
#'   canonical device names such as `"/device:CPU:0"` (empty when there is
#'   none).
#' @family devices
#' @export
#' @examplesIf multigpu::is_multigpu_available()
#' virtual_devices(2)
#' available_devices()
available_devices <- function() {
  lapply(call_core("available_devices"), as.character)
}
