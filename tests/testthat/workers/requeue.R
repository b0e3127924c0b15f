# A resumable training script as R users write it, run as a Slurm batch job:
#   sbatch --time=2 --requeue --signal=B:USR1@50 job.sh
# where job.sh ends with `exec Rscript requeue.R CKPT_DIR OUT.rds SECONDS`.
# Nothing in it is about Slurm except the tests' slowing of the first
# allocation (SECONDS after every batch until Slurm has requeued the job),
# so that it reaches its time limit. Writes OUT.rds: the final weights.
library(keras3)
# multigpu, from the source tree under test or installed (load.R, beside this).
source(file.path(dirname(sub("^--file=", "", grep("^--file=", commandArgs(), value = TRUE))),
                 "load.R"))
args <- commandArgs(trailingOnly = TRUE)
checkpoint_dir <- args[[1]]
seconds <- as.numeric(args[[3]])
restarts <- as.integer(Sys.getenv("SLURM_RESTART_COUNT", "0"))

virtual_devices(2)
build_model <- function() {
  set_random_seed(1234)
  model <- keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(1)
  model |> compile(optimizer = optimizer_adam(0.01),
                   loss = loss_mean_squared_error())
  model
}
strategy <- mirrored_strategy()
with(strategy$scope(), {
  model <- make_or_restore_model(checkpoint_dir, build_model)
})
x <- matrix(sin(seq_len(64 * 4)), ncol = 4)
slow <- callback_lambda(on_train_batch_end = function(batch, logs) {
  if (restarts == 0) Sys.sleep(seconds)
})
model |> fit(x, rowSums(x), batch_size = 8, epochs = 3, shuffle = FALSE,
             verbose = 0, callbacks = c(checkpoint_callbacks(checkpoint_dir), slow))
saveRDS(model$get_weights(), args[[2]])
cat("done, restarts:", restarts, "\n")
