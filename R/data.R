#' A batched dataset for multi-device training
#'
#' Builds a `tf$data$Dataset` of `(x, y)` batches whose global batch size is
#' `per_replica_batch_size` times the number of replicas of `strategy` (so
#' each device gets `per_replica_batch_size` rows per step), with the
#' pipeline steps the distributed-training guide recommends: shuffling,
#' caching and prefetching.
#'
#' R doubles are sent as float32, integers as int32, and factors as 0-based
#' integer codes (class labels).
#'
#' @param x Features: an R array or matrix (first dimension = samples), a
#'   list of arrays (several inputs; named for named inputs), or a
#'   `tf$data$Dataset` of single, unbatched examples.
#' @param y Targets, like `x`; `NULL` when `x` is a dataset.
#' @param per_replica_batch_size Rows each device processes per step, a
#'   whole number.
#' @param strategy The strategy that will train on the data (its number of
#'   replicas sets the global batch), a model from [multi_gpu_model()] (its
#'   number of devices), or `NULL` for the strategy whose scope is open.
#' @param shuffle `TRUE` to shuffle the examples anew every epoch.
#' @param shuffle_buffer Shuffle buffer size, a whole number; `NULL` for the
#'   whole data.
#' @param seed Shuffle seed, a whole number, or `NULL`. With a seed, the
#'   order of epoch e depends only on the seed and e, so a run resumed by
#'   [checkpoint_callbacks()] (given the dataset as `data`) sees the same
#'   batches as an uninterrupted one.
#' @param cache `NULL` or `FALSE` for no cache; `TRUE` or `"memory"` to keep
#'   the examples in memory after the first epoch (`dataset_cache()` in the
#'   guide); or a file path prefix for a cache on disk, such as
#'   `"./cache/train"` (a bare name close to `"memory"`, such as `"memroy"`,
#'   is refused as a likely typo: write `"./memroy"` for such files; a
#'   directory is refused too).
#' @param prefetch `TRUE` to prepare the next batches while the current one
#'   trains (`dataset_prefetch()` in the guide).
#' @param shard_policy How multi-worker training splits the data between
#'   workers: `"data"` (default), `"file"`, `"auto"` or `"off"`.
#' @param drop_remainder `TRUE` to drop a final batch smaller than the
#'   global batch.
#' @returns A `tf$data$Dataset` of global batches, for `fit()` and
#'   `evaluate()`. Warnings of the Python core (a final batch smaller than
#'   the number of devices, data smaller than one global batch) are R
#'   warnings of class `multigpu_warning`.
#' @family multi-device training
#' @export
#' @examplesIf multigpu::is_multigpu_available()
#' virtual_devices(2)
#' strategy <- mirrored_strategy()
#' x <- matrix(runif(400), ncol = 4)
#' dataset <- distributed_dataset(x, rowSums(x), per_replica_batch_size = 16,
#'                                strategy = strategy, shuffle = TRUE,
#'                                cache = TRUE)
#' dataset$element_spec
distributed_dataset <- function(x, y = NULL, per_replica_batch_size = 64,
                                strategy = NULL, shuffle = FALSE,
                                shuffle_buffer = NULL, seed = NULL,
                                cache = NULL, prefetch = TRUE,
                                shard_policy = "data",
                                drop_remainder = FALSE) {
  call_core("distributed_dataset",
            as_structure(as_model_data(x)),
            y = as_structure(as_model_data(y)),
            per_replica_batch_size = as_count(per_replica_batch_size,
                                              null_ok = FALSE),
            strategy = strategy,
            shuffle = as_flag(shuffle),
            shuffle_buffer = as_count(shuffle_buffer),
            seed = as_count(seed, minimum = -Inf),
            cache = as_cache(cache),
            prefetch = as_flag(prefetch),
            shard_policy = shard_policy,
            drop_remainder = as_flag(drop_remainder))
}

#' Several arrays as Python wants them for a dataset: an unnamed list is a
#' tuple (a list would be stacked into one tensor), a named list a dict.
#' @noRd
as_structure <- function(x) {
  if (is.list(x) && !inherits(x, "python.builtin.object") &&
      is.null(names(x))) {
    return(do.call(reticulate::tuple, x))
  }
  x
}

#' `cache`: NULL/FALSE none, TRUE or "memory" in memory, else a path
#' prefix (`~` expanded). The core judges the value (typos of "memory",
#' directories, other types).
#' @noRd
as_cache <- function(cache, arg = caller_arg(cache), call = caller_env()) {
  force(arg)
  if (is.logical(cache)) return(as_flag(cache, arg, call = call))
  if (is.factor(cache)) cache <- as.character(cache)
  if (is.character(cache) && length(cache) == 1L) {
    if (is.na(cache)) {
      multigpu_abort(sprintf(
        "`%s` must not be NA: use NULL or FALSE (no cache), TRUE or \"memory\" (in memory), or a file path prefix such as \"./cache/train\".",
        arg
      ), call = call)
    }
    return(path.expand(cache))
  }
  cache
}
