# Shared by every test file (sourced before setup.R).

# Skips only where Python truly is not usable, and never in CI, where a
# missing Python is a failure, not a reason to skip.
skip_if_no_multigpu <- function() {
  if (is_multigpu_available()) return(invisible(TRUE))
  problem <- multigpu_config()$problem
  if (nzchar(Sys.getenv("CI"))) {
    stop("multigpu's Python environment is required in CI: ", problem)
  }
  skip(paste("multigpu's Python environment is not usable:", problem))
}

# Skips when an R package is not installed, without loading it: loading
# keras3 registers its compile()/fit()/evaluate()/predict() methods, which
# then come first for every Keras model in this process (testthat's
# skip_if_not_installed() loads the namespace). Tests that need keras3 run it
# in R sessions of their own.
skip_if_not_installed_unloaded <- function(package) {
  if (!nzchar(system.file(package = package))) {
    skip(paste0("{", package, "} is not installed"))
  }
  invisible(TRUE)
}

keras_py <- function() reticulate::import("keras")

# A tiny classifier: `inputs` features -> `units` hidden -> `outputs` logits.
tiny_model <- function(inputs = 4L, units = 8L, outputs = 3L,
                       activation = "softmax", name = NULL) {
  keras <- keras_py()
  input <- keras$Input(shape = list(as.integer(inputs)), name = "features")
  hidden <- keras$layers$Dense(as.integer(units), activation = "relu",
                               name = "hidden")(input)
  output <- keras$layers$Dense(as.integer(outputs), activation = activation,
                               name = "scores")(hidden)
  keras$Model(input, output, name = name)
}

# iris as model data: a numeric matrix and a factor of 3 classes.
iris_x <- function(rows = seq_len(150)) unname(as.matrix(iris[rows, 1:4]))
iris_y <- function(rows = seq_len(150)) iris$Species[rows]

# A tiny_model() on `gpus` devices, compiled as a classifier.
compiled_parallel <- function(gpus = 2, metrics = "accuracy") {
  parallel <- multi_gpu_model(tiny_model(), gpus = gpus)
  parallel |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy",
                      metrics = metrics)
  parallel
}

# Runs R code in a fresh R session with this multigpu (installed, or the
# source tree when the tests run from it); returns its output lines with
# attribute `status`.
run_r <- function(code, env = character()) {
  path <- getNamespaceInfo("multigpu", "path")
  # A source tree (pkgload::load_all()) has R/*.R files; an installed
  # package has R/multigpu.rdb instead.
  from_source <- length(list.files(file.path(path, "R"), "\\.R$")) > 0L
  load <- if (from_source) {
    sprintf("pkgload::load_all(%s, quiet = TRUE)", deparse(path))
  } else {
    "library(multigpu)"
  }
  script <- tempfile(fileext = ".R")
  writeLines(gsub("library(multigpu)", load, code, fixed = TRUE), script)
  libs <- paste(.libPaths(), collapse = .Platform$path.sep)
  output <- suppressWarnings(system2(
    file.path(R.home("bin"), "Rscript"), c("--vanilla", shQuote(script)),
    stdout = TRUE, stderr = TRUE,
    env = c(paste0("R_LIBS=", shQuote(libs)), env)
  ))
  structure(output, status = attr(output, "status") %||% 0L)
}

`%||%` <- function(x, y) if (is.null(x)) y else x

# Worker R processes (started by Slurm, the launcher or the tests).

# The environment of a worker R process: this multigpu (the source tree
# when the tests run from it) and this R library path.
worker_env <- function() {
  path <- getNamespaceInfo("multigpu", "path")
  from_source <- length(list.files(file.path(path, "R"), "\\.R$")) > 0L
  c(R_LIBS = paste(.libPaths(), collapse = .Platform$path.sep),
    MULTIGPU_R_SOURCE = if (from_source) path else "",
    TF_CPP_MIN_LOG_LEVEL = "2")
}

# Runs `command` with the worker environment; returns its output lines with
# attribute `status`.
run_command <- function(command, args) {
  withr::with_envvar(worker_env(), {
    output <- suppressWarnings(system2(command, args, stdout = TRUE,
                                       stderr = TRUE))
  })
  structure(output, status = attr(output, "status") %||% 0L)
}

# srun, after starting the single-node Slurm of .ci/slurm-up.sh if needed.
# Skips where Slurm cannot start (not root, no apt-get), never in CI.
skip_if_no_slurm <- function() {
  srun_works <- function() {
    identical(attr(run_command("srun", c("-n2", "true")), "status"), 0L)
  }
  if (nzchar(Sys.which("srun")) && srun_works()) return(invisible(TRUE))
  up <- file.path(Sys.getenv("MULTIGPU_CORE", "../.."), ".ci", "slurm-up.sh")
  said <- if (file.exists(up)) run_command("bash", shQuote(up)) else
    paste("no", up, "(set MULTIGPU_CORE to the multigpu checkout)")
  if (nzchar(Sys.which("srun")) && srun_works()) return(invisible(TRUE))
  reason <- paste("Slurm cannot be started here:", paste(tail(said, 3), collapse = " "))
  if (nzchar(Sys.getenv("CI"))) stop(reason, " (CI must run the Slurm tests)")
  skip(reason)
}

# What one process trains on the workers' global batches: the worker
# scripts' model (4 inputs, Dense(8, relu), Dense(1); SGD 0.05 with
# momentum 0.9, mean squared error) from `initial` weights, on data$x and
# data$y for data$epochs epochs, in order. Returns its loss history and
# final weights.
one_process_fit <- function(initial, data, batch_size) {
  keras <- keras_py()
  reference <- keras$Sequential(list(
    keras$Input(shape = list(ncol(data$x))),
    keras$layers$Dense(8L, activation = "relu"),
    keras$layers$Dense(1L)
  ))
  reference$set_weights(initial)
  reference |> compile(optimizer = keras$optimizers$SGD(0.05, momentum = 0.9),
                       loss = "mse")
  history <- reference |> fit(data$x, data$y, batch_size = batch_size,
                              epochs = data$epochs, shuffle = FALSE, verbose = 0)
  list(loss = history$metrics$loss, weights = reference$get_weights())
}
