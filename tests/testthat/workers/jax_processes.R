# One process of a JAX training job of several, the same script on each:
#   python -m multigpu.launch --workers 2 -- Rscript jax_processes.R DATA.rds OUT_DIR
#   srun -n 2 Rscript jax_processes.R DATA.rds OUT_DIR
# Nothing in it is about processes: virtual_devices(2) on each, and
# multi_gpu_model() over every process's devices (gpus = NULL). Writes
# OUT_DIR/process-<index>.rds: the devices seen, the initial and final
# weights, and the loss history.
library(keras3)
use_backend("jax")
# multigpu, from the source tree under test or installed (load.R, beside this).
source(file.path(dirname(sub("^--file=", "", grep("^--file=", commandArgs(), value = TRUE))),
                 "load.R"))
args <- commandArgs(trailingOnly = TRUE)
data <- readRDS(args[[1]])

virtual_devices(2)
set_random_seed(1234)
model <- keras_model_sequential(input_shape = ncol(data$x)) |>
  layer_dense(8, activation = "relu") |>
  layer_dense(1)
initial <- get_weights(model)
parallel <- multi_gpu_model(model)
parallel |> compile(optimizer = optimizer_sgd(0.05, momentum = 0.9),
                    loss = loss_mean_squared_error())
history <- parallel |> fit(data$x, data$y, batch_size = data$batch_size,
                           epochs = data$epochs, shuffle = FALSE, verbose = 0)
jax <- reticulate::import("jax")
index <- jax$process_index()
saveRDS(list(devices = length(jax$devices()), local = length(jax$local_devices()),
             initial = initial, weights = get_weights(model),
             loss = history$metrics$loss),
        file.path(args[[2]], sprintf("process-%d.rds", index)))
cat(sprintf("process %d done\n", index))
