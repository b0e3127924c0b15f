# multi_gpu_model() and model_parallel() on Keras's JAX backend. Keras chooses its backend once per
# process and this one runs TensorFlow, so everything runs in one R process
# of its own (workers/jax.R), as a keras3 user writes it:
# keras3::use_backend("jax"), virtual_devices(4), a keras3 model through
# multi_gpu_model(gpus = 4), and some of the shared scenarios that apply on
# JAX: every invalid input (the same errors, in R's words; they stop before
# training) and a few that train, within the time this process may take.
jax_scenarios <- function() {
  files <- scenario_files_for("jax")
  trained <- c("mlp_fewer_rows_than_replicas", "batchnorm_short_batches_save_reload",
               "mlp_weights_round_trip", "resume_parallel_model_from_checkpoints",
               "branching_model_parallel_two_devices")
  names <- sub("[.]json$", "", basename(files))
  files[startsWith(names, "invalid_") | names %in% trained]
}

test_that("on JAX, multi_gpu_model() and model_parallel() train like one device, multi_gpu_model() stops at NA, refuses what JAX cannot do in R's words, and runs the JAX scenarios", {
  skip_if_no_multigpu()
  skip_if_not_installed_unloaded("keras3")
  jax <- tryCatch(reticulate::import("importlib.metadata")$version("jax"),
                  error = function(e) NA_character_)
  if (is.na(jax) && !nzchar(Sys.getenv("CI"))) {
    skip("JAX is not installed in multigpu's Python environment (the jax extra)")
  }
  out <- tempfile(fileext = ".rds")
  scenarios <- jax_scenarios()
  path <- getNamespaceInfo("multigpu", "path")
  from_source <- length(list.files(file.path(path, "R"), "\\.R$")) > 0L
  output <- withr::with_envvar(
    c(R_LIBS = paste(.libPaths(), collapse = .Platform$path.sep),
      MULTIGPU_R_SOURCE = if (from_source) path else "",
      KERAS_BACKEND = NA, JAX_NUM_CPU_DEVICES = NA,
      TF_CPP_MIN_LOG_LEVEL = "2"),
    suppressWarnings(system2(
      file.path(R.home("bin"), "Rscript"),
      c("--vanilla", shQuote(test_path("workers", "jax.R")), shQuote(out),
        shQuote(test_path("helper-scenarios.R")), shQuote(scenarios)),
      stdout = TRUE, stderr = TRUE)))
  if (!file.exists(out)) stop(paste(output, collapse = "\n"))
  result <- readRDS(out)

  expect_identical(result$backend, "jax")
  expect_identical(result$devices, sprintf("/device:CPU:%d", 0:3))
  expect_identical(result$available, sprintf("/device:CPU:%d", 0:3))
  expect_identical(result$engine, "jax")
  # sync_batchnorm = NULL, the default, is TRUE on JAX.
  expect_true(result$sync_batchnorm)
  expect_true(result$template_is_model)
  # 42 rows in batches of 16 (a last batch of 10, split 3/3/2/2): the
  # template's numbers on one device.
  expect_gt(result$initial_change, 1e-3)
  for (quantity in names(result$differences)) {
    expect_lte(result$differences[[quantity]], 1e-5, label = quantity)
  }

  # model_parallel() on JAX: the weights split across the 4 devices, one
  # device's numbers (42 rows in batches of 16, Adam), no device holding
  # the whole model.
  parallel_model <- result$model_parallel
  expect_identical(parallel_model$class,
                   "multigpu.partition.jax_sharding.ShardedWeightsModel")
  expect_identical(parallel_model$devices, sprintf("/device:CPU:%d", 0:3))
  for (part in names(parallel_model$differences)) {
    expect_lte(parallel_model$differences[[part]], 1e-5,
               label = paste("model_parallel", part))
  }
  expect_length(parallel_model$device_bytes, 4L)
  expect_true(all(parallel_model$device_bytes < parallel_model$model_bytes))
  expect_identical(parallel_model$plan$device, sprintf("/device:CPU:%d", 0:3))
  expect_identical(parallel_model$plan$weights, parallel_model$device_bytes)
  expect_true("multigpu_value_error" %in% result$errors$microbatches$class)
  expect_match(result$errors$microbatches$message,
               "Invalid `microbatches`: received 2", fixed = TRUE)
  expect_match(result$errors$microbatches$message,
               "Leave microbatches = 1", fixed = TRUE)

  expect_true(result$check_finite)
  expect_true("multigpu_value_error" %in% result$guard$class)
  expect_match(result$guard$message, paste0(
    "Non-finite training data in epoch 1, batch 2 (counted from 1): x has 1 ",
    "NaN value in 1 row (row 3 of the batch"), fixed = TRUE)
  expect_true(result$guard_finite)

  errors <- result$errors
  expect_true("multigpu_value_error" %in% errors$sync_batchnorm$class)
  expect_match(errors$sync_batchnorm$message,
               "received FALSE on the JAX backend", fixed = TRUE)
  expect_match(errors$sync_batchnorm$message,
               "Pass sync_batchnorm = TRUE or leave it NULL (the default)",
               fixed = TRUE)
  expect_true("multigpu_value_error" %in% errors$cpu_merge$class)
  expect_match(errors$cpu_merge$message, "Leave cpu_merge = TRUE", fixed = TRUE)
  expect_true("multigpu_value_error" %in% errors$engine$class)
  expect_match(errors$engine$message, 'Use engine = "auto"', fixed = TRUE)
  # The same gpus errors as on TensorFlow.
  expect_true("multigpu_value_error" %in% errors$gpus$class)
  expect_match(errors$gpus$message, "A device count must be >= 2, not 1.",
               fixed = TRUE)
  for (message in lapply(errors, `[[`, "message")) {
    expect_true(speaks_r(message), label = message)
  }

  expect_identical(names(result$scenarios) %||% character(),
                   sub("[.]json$", "", basename(scenarios)))
  # Once scenario files carry "jax" in their "backends", some are run here.
  if (length(scenario_files_for("jax"))) expect_gt(length(scenarios), 0L)
  for (name in names(result$scenarios)) {
    expect_null(result$scenarios[[name]], label = sprintf("scenario %s on JAX", name))
  }
})

test_that("on JAX, two R processes started by the launcher train as one process on every process's devices", {
  skip_if_no_multigpu()
  skip_if_not_installed_unloaded("keras3")
  out <- withr::local_tempdir()
  set.seed(5)
  x <- matrix(stats::runif(22 * 4), ncol = 4)
  # 22 rows in batches of 6 on 2 x 2 devices: three batches split unevenly
  # (2/2/1/1), then 4 rows, one per device.
  data <- list(x = x, y = matrix(rowSums(x), ncol = 1), batch_size = 6L, epochs = 2L)
  saveRDS(data, file.path(out, "data.rds"))
  rscript <- c(file.path(R.home("bin"), "Rscript"), "--vanilla",
               test_path("workers", "jax_processes.R"), file.path(out, "data.rds"), out)
  output <- withr::with_envvar(c(KERAS_BACKEND = NA, JAX_NUM_CPU_DEVICES = NA), {
    run_command(multigpu_config()$python, c(
      "-m", "multigpu.launch", "--workers", "2", "--timeout", "300", "--",
      shQuote(rscript)))
  })
  expect_identical(attr(output, "status"), 0L, info = paste(output, collapse = "\n"))
  processes <- lapply(0:1, function(i) readRDS(file.path(out, sprintf("process-%d.rds", i))))
  for (process in processes) {
    expect_identical(c(process$devices, process$local), c(4L, 2L))
  }
  expect_identical(processes[[1]]$weights, processes[[2]]$weights)

  reference <- one_process_fit(processes[[1]]$initial, data, batch_size = 6)
  expect_equal(processes[[1]]$loss, reference$loss, tolerance = 1e-5)
  expect_equal(processes[[1]]$weights, reference$weights, tolerance = 1e-5)
})
