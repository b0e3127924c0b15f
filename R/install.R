#' Install multigpu's Python packages into a named environment
#'
#' Most users need nothing of this: loading multigpu declares its Python
#' requirements with `reticulate::py_require()` (see [multigpu_config()]).
#' `install_multigpu()` is for those who prefer a named virtual environment,
#' as `keras3::install_keras()` makes one: it creates `envname` and installs
#' into it with pip the multigpu Python package this R package carries, with
#' TensorFlow 2.21 (the CPU build, or CUDA's with `gpu = TRUE`) and Keras
#' 3.15, and on the JAX backend (`keras3::use_backend("jax")` first) JAX in
#' the range multigpu is tested with. The default `r-multigpu` is found by
#' itself in a new R session.
#'
#' @param envname Name of the virtual environment (in reticulate's
#'   virtualenv root, `$WORKON_HOME` or `~/.virtualenvs`), or a path.
#' @param gpu `TRUE` for TensorFlow with CUDA (Linux with an NVIDIA GPU),
#'   `FALSE` for the CPU build; `NA` (default) decides by whether
#'   `nvidia-smi` is on the `PATH` of a Linux machine.
#' @param demo `TRUE` (default) to also install scikit-learn, whose bundled
#'   digits data the vignettes train on.
#' @param extra_packages More pip requirements to install, or `NULL`.
#' @param python_version The Python versions to create the environment
#'   with, as reticulate's `virtualenv_create()` reads them.
#' @param new_env `TRUE` to delete `envname` first if it exists; by
#'   default, only for `"r-multigpu"`.
#' @returns `envname`, invisibly.
#' @family multigpu environment
#' @export
#' @examples
#' \dontrun{
#' install_multigpu()
#' # in a new R session:
#' library(multigpu)
#' multigpu_config()
#' }
install_multigpu <- function(envname = "r-multigpu", gpu = NA, demo = TRUE,
                             extra_packages = NULL,
                             python_version = supported_python,
                             new_env = identical(envname, "r-multigpu")) {
  envname <- as_string(envname, null_ok = FALSE)
  if (!is.logical(gpu) || length(gpu) != 1L) {
    multigpu_abort(sprintf("`gpu` must be TRUE, FALSE or NA, not %s.", describe(gpu)))
  }
  if (is.na(gpu)) {
    gpu <- identical(Sys.info()[["sysname"]], "Linux") && nzchar(Sys.which("nvidia-smi"))
  }
  extras <- c(if (gpu) "gpu" else "cpu", backend_extras(),
              if (isTRUE(as_flag(demo))) "demo")
  packages <- c(core_requirement(extras), as.character(extra_packages))
  if (isTRUE(as_flag(new_env)) && reticulate::virtualenv_exists(envname)) {
    reticulate::virtualenv_remove(envname, confirm = FALSE)
  }
  constraints <- system.file("python", "constraints.txt", package = "multigpu")
  reticulate::virtualenv_create(envname, version = python_version)
  reticulate::virtualenv_install(envname, packages,
                                 pip_options = c("--constraint", constraints))
  message(sprintf(
    "Installed multigpu's Python packages into '%s'. Restart R: multigpu %s.",
    envname,
    if (identical(envname, "r-multigpu")) "finds it by itself" else
      sprintf("uses it with Sys.setenv(MULTIGPU_PYTHON = \"%s\") before library(multigpu)",
              reticulate::virtualenv_python(envname))
  ))
  invisible(envname)
}
