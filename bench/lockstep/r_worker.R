# One R-driven benchmark configuration: the same training as the Python
# workers (same model, data, optimizer, batch and epoch timing), driven from
# R. Run by the orchestrator as `Rscript bench/lockstep/r_worker.R CONFIG.json`.
#
# With the multigpu R package installed in MULTIGPU_BENCH_R_LIBRARY, R calls
# the package's multi_gpu_model(), compile(), fit() and predict() on R
# arrays, as an R user would. Without it (the package not installable yet),
# it calls the Python core directly through reticulate; the results say
# which ("api" column).

args <- commandArgs(trailingOnly = TRUE)
library_dir <- Sys.getenv("MULTIGPU_BENCH_R_LIBRARY")
use_package <- nzchar(library_dir) &&
  requireNamespace("multigpu", lib.loc = library_dir, quietly = TRUE)
if (use_package) {
  library(multigpu, lib.loc = library_dir)
}

lock_problem <- reticulate::import("bench.lockstep.memory")$lock_memory()
# SIGUSR1 from the orchestrator: Python stacks to the log (see worker.py).
reticulate::import("faulthandler")$register(
  reticulate::import("signal")$SIGUSR1, all_threads = TRUE)
worker <- reticulate::import("bench.lockstep.worker")
protocol <- reticulate::import("bench.lockstep.protocol")
timer <- reticulate::import("bench.lockstep.timer")
channel <- protocol$Channel$from_env()

# The model from the R package's API, or from the Python core directly.
parallel_model <- function(template, config) {
  gpus <- worker$gpus_argument(config$devices)
  if (use_package) {
    model <- multi_gpu_model(template, gpus = gpus, engine = config$engine)
    do.call(compile, c(list(model), config$compile_args))
    return(model)
  }
  core <- reticulate::import("multigpu")
  arguments <- list(template, gpus = gpus)
  if (!is.null(config$engine)) arguments$engine <- config$engine
  model <- do.call(core$multi_gpu_model, arguments)
  do.call(model$compile, config$compile_args)
  model
}

train <- function(model, x, y, config, timer) {
  if (use_package) {
    fit(model, x, y, batch_size = config$batch_size, epochs = config$epochs,
        verbose = 0, callbacks = list(timer))
  } else {
    model$fit(reticulate::np_array(x, dtype = "float32"), y,
              batch_size = config$batch_size, epochs = config$epochs,
              verbose = 0L, callbacks = list(timer))
  }
}

infer <- function(model, x, config) {
  if (use_package) {
    predict(model, x, batch_size = config$batch_size, verbose = 0)
  } else {
    model$predict(reticulate::np_array(x, dtype = "float32"),
                  batch_size = config$batch_size, verbose = 0L)
  }
}

run <- function(config_path) {
  config <- worker$load_config(config_path)
  # keras3 (loaded with multigpu) makes a tensor when Keras is imported; R
  # holds it until a collection, and TensorFlow's devices can only be
  # configured while no tensor exists.
  gc(verbose = FALSE)
  worker$configure_devices(config$devices, "multi_gpu_model")
  keras <- reticulate::import("keras")
  models <- reticulate::import("bench.models")
  keras$utils$set_random_seed(config$seed)
  data <- models$load_data(config$workload, config$seed, config$rows)
  x <- data[[1]]  # an R double array, samples first
  y <- data[[2]]  # an R integer vector of class ids
  config$compile_args <- models$compile_args()
  model <- parallel_model(models$build_model(config$workload), config)
  worker$announce(channel, model, model$devices, dim(x)[[1]], driver = "R",
                  api = if (use_package) "R package" else "reticulate",
                  memory_locked = !nzchar(lock_problem))
  train(model, x, y, config, timer$LockstepTimer(channel))
  worker$timed_predictions(channel, function() infer(model, x, config),
                           config$predict_calls)
  worker$finish(channel, model$devices)
}

tryCatch(run(args[[1]]), error = function(error) {
  channel$send("error", message = paste("R:", conditionMessage(error)))
  quit(save = "no", status = 1)
})
