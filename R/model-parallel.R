#' Partitions one model across devices (model parallelism)
#'
#' When one copy of a model does not fit on one device, [multi_gpu_model()]
#' cannot help: it copies the whole model onto every device.
#' `model_parallel()` cuts the model instead. Its layers are split into
#' consecutive stages, one per device; each stage's weights are created on
#' its device, its forward and backward pass run there, and activations
#' move from stage to stage. Outputs and training steps are those of
#' `model`.
#'
#' @section How `split` is read:
#' * `NULL`: stages are chosen so that the bytes of the weights are as even
#'   as possible between devices.
#' * A character vector, e.g. `split = c("dense_2", "dense_4")`: the layers
#'   where stages 2, 3, ... start, in the order of `model$layers`.
#' * A numeric vector: the same, as positions in `model$layers`, counted
#'   from 1 as usual in R.
#' * A list of character vectors, one per stage, e.g.
#'   `list(c("left_a", "left_b"), c("right", "merge", "head"))`: the layers
#'   of each stage, e.g. to put two branches on two devices.
#'
#' A stage may only read the outputs of its own or earlier stages; a split
#' that breaks this, or that cuts inside a nested model or across a Keras
#' mask, is rejected with the reason.
#'
#' @section Pipelining:
#' With `microbatches = k`, every batch runs as `k` micro-batches that flow
#' through the stages one after the other (GPipe), so a stage can work on
#' one micro-batch while the next stage works on the previous one. The
#' gradients are summed over the micro-batches and the optimizer steps once
#' per batch: results equal `microbatches = 1` (layers using batch
#' statistics, such as batch normalisation, see micro-batches).
#'
#' @section On the JAX backend:
#' After `keras3::use_backend("jax")` the model is not cut into stages: each
#' weight is split across the devices instead (XLA's sharding, through
#' Keras's `ModelParallel` distribution), along its largest dimension that
#' the number of devices divides, and every device computes on the whole
#' batch, so batches of any size give the numbers of one device. A weight
#' with no such dimension stays whole on every device if it is smaller than
#' 64 KiB (a bias of 10 classes on 4 devices); a larger one, or a model none
#' of whose weights can be split, is an error naming the weights and their
#' shapes. `split` and `microbatches`, which describe stages, are refused
#' there (leave `split = NULL`, `microbatches = 1`). The returned model (a
#' Python `ShardedWeightsModel`) has `$template`, `$devices`,
#' `$weight_layouts()` and `$weight_table()` (the bytes each device holds),
#' and [memory_plan()] gives each device's share.
#'
#' @section Model saving:
#' `model` itself is copied, not moved: the returned model's `$template` is
#' that copy, with its weights on the stage devices, and it holds the
#' trained weights. `save_model_hdf5()`, `save_model_weights_hdf5()` and
#' `load_model_weights_hdf5()` given the returned model act on the template,
#' and the file is a plain Keras model that loads on any machine.
#'
#' @param model A Keras model (Sequential or functional, built: with an
#'   input layer or called once on a batch). Subclassed models have no graph
#'   of layers to cut; use [multi_gpu_model()] for them.
#' @param devices `NULL` for every GPU (without GPUs, every logical CPU
#'   device; with `split` given, one device per stage of `split`), one
#'   number >= 2 for that many devices, two or more GPU ids, or device
#'   names, as for `gpus` of [multi_gpu_model()]. One stage per device.
#' @param split `NULL` to balance the weights between the devices, or where
#'   to cut: see "How `split` is read".
#' @param microbatches The number of micro-batches each batch is pipelined
#'   as; 1 (default) for no pipelining.
#' @returns A Keras model (a Python `PartitionedModel`; on JAX a
#'   `ShardedWeightsModel`, see "On the JAX backend") used just like
#'   `model`: [compile()][keras3::compile.keras.src.models.model.Model],
#'   [fit()][keras3::fit.keras.src.models.model.Model],
#'   [evaluate()][keras3::evaluate.keras.src.models.model.Model],
#'   [predict()][keras3::predict.keras.src.models.model.Model]. It has
#'   `$template`, `$devices`, `$stages` (the layer names of each stage) and
#'   `$stage_table()`.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available() && requireNamespace("keras3", quietly = TRUE)
#' library(keras3)
#' virtual_devices(2)   # no GPU: simulate 2 devices, before any model exists
#' model <- keras_model_sequential(input_shape = 4) |>
#'   layer_dense(16, activation = "relu", name = "encode") |>
#'   layer_dense(16, activation = "relu", name = "transform") |>
#'   layer_dense(1, name = "score")
#' partitioned <- model |> model_parallel(devices = 2, split = "transform")
#' partitioned$stages   # list(c("encode"), c("transform", "score"))
#' partitioned |> compile(loss = loss_mean_squared_error(), optimizer = optimizer_adam())
#' x <- matrix(runif(256), ncol = 4)
#' history <- partitioned |> fit(x, rowSums(x), epochs = 2, verbose = 0)
#' placement_report(partitioned, x[1:32, ], rowSums(x[1:32, ]))
model_parallel <- function(model, devices = NULL, split = NULL,
                           microbatches = 1) {
  call_core("model_parallel", check_model(model),
            devices = as_device_list(devices),
            split = as_split(split),
            microbatches = as_count(microbatches, null_ok = FALSE))
}

#' Coerce `split` of model_parallel(): names stay names, R positions
#' (1-based) become Python indices, a list becomes one list of layers per
#' stage.
#' @noRd
as_split <- function(x, arg = caller_arg(x), call = caller_env()) {
  force(arg)
  if (is.null(x) || inherits(x, "python.builtin.object")) return(x)
  if (is.factor(x)) x <- as.character(x)
  if (is.list(x)) {
    return(lapply(unname(x), function(group) {
      as.list(as_split_entries(group, arg, call))
    }))
  }
  as.list(as_split_entries(x, arg, call))
}

as_split_entries <- function(x, arg, call) {
  if (is.factor(x)) x <- as.character(x)
  if (is.character(x)) {
    if (anyNA(x) || !all(nzchar(x))) {
      multigpu_abort(sprintf(
        "`%s` contains NA or an empty name: received %s. Use layer names such as c(\"dense_2\").",
        arg, describe(x)
      ), call = call)
    }
    return(unname(x))
  }
  if (is.numeric(x)) {
    problem <- count_problem(x)
    if (is.null(problem) && any(x < 1)) problem <- "is not a position >= 1"
    if (!is.null(problem)) {
      multigpu_abort(sprintf(
        "`%s` %s: received %s. Use positions in model$layers counted from 1 (e.g. %s = 3) or layer names.",
        arg, problem, describe(x), arg
      ), call = call)
    }
    return(as.integer(unname(x)) - 1L)
  }
  multigpu_abort(sprintf(
    "`%s` must be layer names, positions in model$layers, or a list of them (one per stage), not %s.",
    arg, describe(x)
  ), class = "multigpu_type_error", call = call)
}
