#' Simulate several devices on one
#'
#' Splits the first physical device of a type into `n` logical devices, so
#' multi-device code ([multi_gpu_model()], [mirrored_strategy()]) runs on a
#' machine with one CPU and no GPU. TensorFlow fixes its devices when it
#' starts, so call this first thing, right after `library(keras3)` and
#' `library(multigpu)` (in either order), before building a model or creating
#' a tensor. keras3 starts TensorFlow when it loads Keras; that is fine: as
#' long as no tensor, variable or model exists, TensorFlow is restarted with
#' the new devices. Calling it again with the same `n` is harmless; a
#' different `n` while a model or tensor exists signals a
#' `multigpu_runtime_error` naming what exists (remove it with `rm()`, or
#' restart R).
#'
#' On the JAX backend (`keras3::use_backend("jax")`) it sets JAX's number of
#' CPU devices, which JAX reads once, when it starts: call it before building
#' a model or creating a tensor, and before keras3 has started Python if you
#' can (keras3 makes a tensor as soon as Keras loads, and JAX, unlike
#' TensorFlow, cannot be restarted: a different `n` then signals a
#' `multigpu_runtime_error` saying to restart R). There only `"CPU"` and
#' `threads = NULL` apply.
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
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' library(multigpu)
#' virtual_devices(2)   # before any model or tensor exists
#' available_devices()
virtual_devices <- function(n, device_type = "CPU", memory_limit = NULL,
                            threads = NULL) {
  n <- as_count(n, null_ok = FALSE)
  threads <- as_count(threads)
  if (!reticulate::py_available(initialize = FALSE) &&
      identical(toupper(as.character(device_type)), "CPU") && n > 1L &&
      !identical(threads, 0L)) {
    # TensorFlow reads this once per process, when it creates its first
    # device, which keras3's load hook does when the core imports Keras; the
    # core sets it too (and clears it for threads = 0).
    Sys.setenv(TF_OVERRIDE_GLOBAL_THREADPOOL = "1")
  }
  if (identical(keras_backend(), "jax") &&
      identical(toupper(as.character(device_type)), "CPU")) {
    set_jax_cpu_devices(n)
  }
  start_core_for_configuration()
  call_core("virtual_devices", n, device_type = device_type,
            memory_limit = as_count(memory_limit), threads = threads)
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

#' JAX's CPU device count, for a JAX not imported yet.
#'
#' Importing the core imports Keras, whose keras3 load hook makes a tensor,
#' which starts JAX with its default devices before the core could set
#' `jax_num_cpu_devices`. JAX reads that option's environment variable when
#' it is imported, so it is set first, in R's environment (for a Python not
#' started yet) and in Python's (for one keras3 started). Once JAX runs it
#' changes nothing, and the core says whether it came too late.
#' @noRd
set_jax_cpu_devices <- function(n) {
  if (reticulate::py_available(initialize = FALSE)) {
    if (reticulate::py_eval("'jax' in __import__('sys').modules")) {
      return(invisible(FALSE))
    }
    reticulate::import("os")$environ$update(
      list(JAX_NUM_CPU_DEVICES = as.character(n)))
  }
  Sys.setenv(JAX_NUM_CPU_DEVICES = as.character(n))
  invisible(TRUE)
}

#' Import the core, then free what R no longer references.
#'
#' Before a call that configures TensorFlow ([virtual_devices()],
#' [multi_worker_strategy()]). The tensor keras3's load hook makes when the
#' core imports Keras, like any tensor R no longer references, is freed only
#' when R collects it; the core restarts a started TensorFlow only when no
#' tensor is left.
#' @noRd
start_core_for_configuration <- function(call = caller_env()) {
  core(call = call)
  gc(verbose = FALSE)
  invisible()
}
