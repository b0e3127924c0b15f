# One worker of a multi-worker training run, the same script on every worker:
#   srun -n 2 Rscript train.R DATA.rds OUT_DIR
#   python -m multigpu.launch --workers 2 -- Rscript train.R DATA.rds OUT_DIR
# Writes OUT_DIR/worker-<index>.rds: replicas, initial and final weights,
# and the loss history. With MULTIGPU_WORKER_KERAS3=true the worker is
# written as keras3 users write it: keras3 attached first, keras3's layers,
# optimizer and loss.
keras3_user <- identical(Sys.getenv("MULTIGPU_WORKER_KERAS3"), "true")
if (keras3_user) library(keras3)
# multigpu, from the source tree under test or installed (load.R, beside this).
source(file.path(dirname(sub("^--file=", "", grep("^--file=", commandArgs(), value = TRUE))),
                 "load.R"))
args <- commandArgs(trailingOnly = TRUE)
data <- readRDS(args[[1]])

# First: on GPU nodes it gives this task its GPUs before TensorFlow starts.
strategy <- multi_worker_strategy()
index <- strategy$cluster_resolver$task_id

if (keras3_user) {
  set_random_seed(1234)
  with(strategy$scope(), {
    model <- keras_model_sequential(input_shape = ncol(data$x)) |>
      layer_dense(8, activation = "relu") |>
      layer_dense(1)
    model |> compile(optimizer = optimizer_sgd(0.05, momentum = 0.9),
                     loss = loss_mean_squared_error())
  })
} else {
  keras <- reticulate::import("keras")
  keras$utils$set_random_seed(1234L)
  with(strategy$scope(), {
    model <- keras$Sequential(list(
      keras$Input(shape = list(ncol(data$x))),
      keras$layers$Dense(8L, activation = "relu"),
      keras$layers$Dense(1L)
    ))
    model |> compile(optimizer = keras$optimizers$SGD(0.05, momentum = 0.9),
                     loss = "mse")
  })
}
initial <- model$get_weights()
dataset <- distributed_dataset(data$x, data$y, per_replica_batch_size = 8,
                               strategy = strategy)
history <- model |> fit_distributed(dataset, epochs = data$epochs, verbose = 0)
saveRDS(list(replicas = strategy$num_replicas_in_sync, initial = initial,
             weights = model$get_weights(), loss = history$metrics$loss),
        file.path(args[[2]], sprintf("worker-%d.rds", index)))
cat(sprintf("worker %d done\n", index))
