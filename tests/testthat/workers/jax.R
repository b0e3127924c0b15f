# multigpu on Keras's JAX backend, from R, as a keras3 user writes it:
#   Rscript jax.R OUT.rds HELPER_SCENARIOS.R SCENARIO.json...
# Keras chooses its backend once per process, and the testthat processes run
# TensorFlow: test-jax.R runs this script in an R process of its own. It
# writes OUT.rds: the devices and the engine, the largest differences between
# a model trained through multi_gpu_model(gpus = 4) (and through
# model_parallel(devices = 4)) and the same model trained on one device,
# the bytes of weights each device holds under model_parallel(), the errors of the arguments JAX refuses, and, for
# each shared scenario given (test-jax.R picks some of those with "jax" in
# their "backends"), NULL or the failure.
library(keras3)
use_backend("jax")
# multigpu, from the source tree under test or installed (load.R, beside this).
source(file.path(dirname(sub("^--file=", "", grep("^--file=", commandArgs(), value = TRUE))),
                 "load.R"))
args <- commandArgs(trailingOnly = TRUE)
out <- args[[1]]

devices <- virtual_devices(4)
result <- list(backend = config_backend(), devices = devices,
               available = available_devices()$CPU)

make_model <- function() {
  set_random_seed(7)
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(2)
}
compiled <- function(model) {
  model |> compile(optimizer = optimizer_adam(0.01), loss = "mse",
                   metrics = "mae")
  model
}
template <- make_model()
reference <- compiled(make_model())
parallel <- withCallingHandlers(
  multi_gpu_model(template, gpus = 4),
  multigpu_warning = function(w) invokeRestart("muffleWarning"))
result$engine <- parallel$engine
result$sync_batchnorm <- parallel$sync_batchnorm
result$template_is_model <- identical(reticulate::py_id(parallel$template),
                                      reticulate::py_id(template))
parallel <- compiled(parallel)

# 42 rows in batches of 16: two batches of 4 rows per device, then 10 rows
# split 3/3/2/2.
set.seed(1)
x <- matrix(runif(42 * 4), ncol = 4)
y <- cbind(rowSums(x), x[, 1] - x[, 2])
trained <- lapply(list(parallel = parallel, reference = reference), function(model) {
  history <- model |> fit(x, y, batch_size = 16, epochs = 2, shuffle = FALSE,
                          verbose = 0)
  list(history = history$metrics,
       evaluation = unlist(model |> evaluate(x, y, batch_size = 16, verbose = 0)),
       predictions = model |> predict(x, batch_size = 16, verbose = 0))
})
largest <- function(a, b) max(abs(unlist(a) - unlist(b)))
result$differences <- c(
  weights = largest(template$get_weights(), reference$get_weights()),
  history = largest(trained$parallel$history, trained$reference$history),
  evaluation = largest(trained$parallel$evaluation, trained$reference$evaluation),
  predictions = largest(trained$parallel$predictions, trained$reference$predictions))
result$initial_change <- largest(template$get_weights(),
                                 make_model()$get_weights())

# The NaN guard, on by default as on TensorFlow: row 20 is in epoch 1,
# batch 2 (row 3 of it, counted from 0); the weights stay finite.
result$check_finite <- parallel$check_finite
bad <- x
bad[20, 2] <- NA
result$guard <- tryCatch({
  parallel |> fit(bad, y, batch_size = 16, shuffle = FALSE, verbose = 0)
  list(class = "none", message = "")
}, error = function(e) list(class = class(e), message = conditionMessage(e)))
result$guard_finite <- all(vapply(parallel$get_weights(),
                                  function(w) all(is.finite(w)), NA))

# model_parallel() on JAX: every weight split across the 4 devices (the
# last layer's bias of 2 stays whole: too small to matter), trained on the
# same 42 rows as one device trains the same model.
sharded <- model_parallel(make_model(), devices = 4)
result$model_parallel <- list(class = class(sharded)[[1]],
                              devices = unlist(sharded$devices))
sharded <- compiled(sharded)
alone <- compiled(make_model())
runs <- lapply(list(sharded = sharded, alone = alone), function(model) {
  before <- model |> predict(x, batch_size = 16, verbose = 0)
  history <- model |> fit(x, y, batch_size = 16, epochs = 2, shuffle = FALSE,
                          verbose = 0)
  list(before = before, history = history$metrics,
       predictions = model |> predict(x, batch_size = 16, verbose = 0),
       weights = model$get_weights())
})
result$model_parallel$differences <- vapply(
  c("before", "history", "predictions", "weights"),
  function(part) largest(runs$sharded[[part]], runs$alone[[part]]), 0)
table <- sharded$weight_table()
result$model_parallel$device_bytes <- vapply(table, function(row) row$variable_bytes, 0)
# memory_plan() gives each device's own shards.
result$model_parallel$plan <- memory_plan(sharded, batch_size = 16)$per_device
result$model_parallel$model_bytes <- sum(vapply(
  sharded$template$get_weights(), function(w) length(w) * 4, 0))

# What JAX refuses, as R conditions in R's words.
refused <- function(...) {
  error <- tryCatch({ multi_gpu_model(make_model(), ...); NULL },
                    error = identity)
  if (is.null(error)) return(list(class = "none", message = ""))
  list(class = class(error), message = conditionMessage(error))
}
result$errors <- list(
  sync_batchnorm = refused(gpus = 4, sync_batchnorm = FALSE),
  cpu_merge = refused(gpus = 4, cpu_merge = FALSE),
  engine = refused(gpus = 4, engine = "replicate"),
  gpus = refused(gpus = 1),
  microbatches = tryCatch({
    model_parallel(make_model(), devices = 4, microbatches = 2)
    list(class = "none", message = "")
  }, error = function(e) list(class = class(e), message = conditionMessage(e))))

# Shared scenarios, through the R runner.
source(args[[2]])
result$scenarios <- list()
for (path in args[-(1:2)]) {
  name <- sub("[.]json$", "", basename(path))
  result$scenarios[name] <- list(tryCatch({
    suppress_multigpu_warnings(run_scenario(path, tempfile(paste0("jax-", name))))
    NULL
  }, error = conditionMessage))
}
saveRDS(result, out)
