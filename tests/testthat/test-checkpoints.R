counting_builder <- function() {
  calls <- 0L
  build <- function() {
    calls <<- calls + 1L
    model <- tiny_model()
    model |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
    model
  }
  list(build = build, calls = function() calls)
}

test_that("checkpoint_callbacks() returns the core's two crash-safe callbacks", {
  skip_if_no_multigpu()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  callbacks <- checkpoint_callbacks(dir)
  expect_length(callbacks, 2L)
  expect_s3_class(callbacks[[1]], "multigpu.checkpoints.backup.AtomicBackupAndRestore")
  expect_s3_class(callbacks[[2]], "multigpu.checkpoints.model_checkpoint.AtomicModelCheckpoint")
  expect_s3_class(callbacks[[1]], "keras.src.callbacks.callback.Callback")
  expect_true(dir.exists(dir))
  expect_identical(checkpoint_callbacks(dir, save_freq = 5)[[2]]$save_freq, 5L)
})

test_that("checkpoint_callbacks() errors: NA and non-whole in R, the rest in Python", {
  skip_if_no_multigpu()
  dir <- withr::local_tempdir()
  expect_error(checkpoint_callbacks(dir, save_freq = 2.5), "`save_freq` is not a whole number",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, save_freq = NA),
               "`save_freq` contains NA or NaN: received NA\\.", class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, save_freq = TRUE),
               "`save_freq` must be a single whole number >= 1, not TRUE",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(NA_character_), "`checkpoint_dir` must be a single non-empty path",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, save_freq = 0), "Invalid `save_freq`: received 0",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, save_freq = "batch"), "Invalid `save_freq`: received \"batch\"",
               class = "multigpu_value_error")
  file <- tempfile()
  writeLines("x", file)
  expect_error(checkpoint_callbacks(file), "which is a file; expected a directory",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, max_to_keep = 0), "Invalid `max_to_keep`: received 0",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, max_to_keep = 1.5), "`max_to_keep` is not a whole number",
               class = "multigpu_value_error")
  expect_error(make_or_restore_model(file.path(file, "ckpt"), function() NULL),
               "`checkpoint_dir`.*cannot be created", class = "multigpu_value_error")
  expect_identical(checkpoint_callbacks(dir, max_to_keep = NULL)[[2]]$max_to_keep, NULL)
  expect_error(checkpoint_callbacks(dir, preemption_signal = "SIGKILL"),
               "Invalid `preemption_signal`: received \"SIGKILL\", which no process can catch",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, preemption_signal = "SIGNOPE"),
               "received \"SIGNOPE\", which is no signal here; expected a signal name such as \"SIGUSR1\", its number, or NULL",
               class = "multigpu_value_error")
  expect_error(checkpoint_callbacks(dir, preemption_signal = 10.5),
               "`preemption_signal` is not a whole number", class = "multigpu_value_error")
  expect_identical(checkpoint_callbacks(dir, max_to_keep = 2)[[2]]$max_to_keep, 2L)
})

test_that("checkpoint_callbacks() prunes to max_to_keep", {
  skip_if_no_multigpu()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  model <- tiny_model()
  model |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  model |> fit(iris_x(), iris_y(), epochs = 3, batch_size = 50, verbose = 0, shuffle = FALSE,
               callbacks = checkpoint_callbacks(dir, max_to_keep = 1))
  expect_identical(grep("[.]keras$", list.files(dir), value = TRUE), "ckpt-3.keras")
})

test_that("make_or_restore_model() builds, then restores the newest checkpoint, and fit() resumes", {
  skip_if_no_multigpu()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  strategy <- mirrored_strategy(2)
  builder <- counting_builder()
  with(strategy$scope(), model <- make_or_restore_model(dir, builder$build))
  expect_identical(builder$calls(), 1L)
  history <- model |> fit(iris_x(), iris_y(), epochs = 2, batch_size = 50, verbose = 0,
                          shuffle = FALSE, callbacks = checkpoint_callbacks(dir))
  expect_length(history$metrics$loss, 2L)
  expect_true(all(c("ckpt-1.keras", "ckpt-2.keras", "backup") %in% list.files(dir)))

  with(strategy$scope(), restored <- make_or_restore_model(dir, builder$build))
  expect_identical(builder$calls(), 1L)  # restored, not built
  expect_equal(predict(restored, iris_x(1:5), verbose = 0),
               predict(model, iris_x(1:5), verbose = 0), tolerance = 1e-6)
  # Running the same training again resumes after the last finished epoch.
  history <- restored |> fit(iris_x(), iris_y(), epochs = 3, batch_size = 50, verbose = 0,
                             shuffle = FALSE, callbacks = checkpoint_callbacks(dir))
  expect_length(history$metrics$loss, 1L)  # epoch 3 only
  expect_true("ckpt-3.keras" %in% list.files(dir))
})

test_that("make_or_restore_model() passes build_fn's problems on as classed errors", {
  skip_if_no_multigpu()
  dir <- withr::local_tempdir()
  expect_error(make_or_restore_model(dir, function() 42L), "it returned an object of type int",
               class = "multigpu_type_error")
  expect_error(make_or_restore_model(dir, 5), "Invalid `build_fn`: received an object of type float",
               class = "multigpu_type_error")
  expect_error(make_or_restore_model(dir, function() stop("no model today")), "no model today")
  expect_error(make_or_restore_model(NA_character_, function() NULL), "`checkpoint_dir` must be a single non-empty path",
               class = "multigpu_value_error")
})

test_that("make_or_restore_model() expands ~ in the directory", {
  skip_if_no_multigpu()
  withr::local_envvar(HOME = withr::local_tempdir())
  builder <- counting_builder()
  model <- make_or_restore_model("~/ckpt", builder$build)
  model |> fit(iris_x(), iris_y(), epochs = 1, verbose = 0, shuffle = FALSE,
               callbacks = checkpoint_callbacks("~/ckpt"))
  expect_true(file.exists(file.path(Sys.getenv("HOME"), "ckpt", "ckpt-1.keras")))
})

test_that("training data that cannot be replayed is an R warning at the start", {
  skip_if_no_multigpu()
  # Batches reshuffled by Dataset.shuffle: another order in a resumed epoch.
  data <- distributed_dataset(iris_x(), iris_y(), per_replica_batch_size = 10)$shuffle(5L)
  model <- tiny_model()
  model |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  # fit_distributed() gives its dataset to the callbacks itself.
  expect_warning(
    fit_distributed(model, data, epochs = 1, verbose = 0,
                    callbacks = checkpoint_callbacks(withr::local_tempdir())),
    "it shuffles with Dataset.shuffle(reshuffle_each_iteration=True)", fixed = TRUE
  )
})

test_that("data that is not a dataset is named", {
  skip_if_no_multigpu()
  expect_error(checkpoint_callbacks(withr::local_tempdir(), data = iris_x()),
               "Invalid `data`: received an object of type ndarray",
               class = "multigpu_type_error")
})

test_that("an Rscript job warned before its time limit requeues itself and ends on the unbroken weights", {
  # Over 3 minutes of a real Slurm allocation's time limit; the gate runs
  # the requeue in Python (tests/python/checkpoints) and Slurm's srun from R.
  skip_unless_full_tier("a Slurm job's time limit, over 3 minutes")
  skip_if_not_installed_unloaded("keras3")
  skip_if_no_multigpu()
  skip_if_no_slurm()
  dir <- withr::local_tempdir()
  rscript <- file.path(R.home("bin"), "Rscript")
  worker <- normalizePath(test_path("workers", "requeue.R"))
  job <- file.path(dir, "job.sh")
  writeLines(c("#!/bin/bash", paste(
    "exec", shQuote(rscript), "--vanilla", shQuote(worker),
    shQuote(file.path(dir, "ckpt")), shQuote(file.path(dir, "requeued.rds")), "9")), job)
  log <- file.path(dir, "job.log")
  # Warned 60 s before a 3-minute limit (delivered 90 to 150 s after the
  # start: time for a loaded machine to start R); 24 steps of 9 s cannot
  # finish in the first allocation.
  submitted <- run_command("sbatch", c(
    "--parsable", "--time=3", "--requeue", "--signal=B:USR1@60",
    "--open-mode=append", paste0("--output=", log), shQuote(job)))
  expect_identical(attr(submitted, "status"), 0L, info = paste(submitted, collapse = "\n"))
  job_id <- sub(";.*", "", submitted[[1]])

  # Meanwhile the same script uninterrupted, outside Slurm.
  unbroken <- run_command(rscript, c("--vanilla", shQuote(worker), shQuote(file.path(dir, "unbroken")),
                                     shQuote(file.path(dir, "unbroken.rds")), "0"))
  expect_identical(attr(unbroken, "status"), 0L, info = paste(unbroken, collapse = "\n"))

  deadline <- Sys.time() + 900
  repeat {
    shown <- run_command("scontrol", c("show", "job", "-o", job_id))
    state <- regmatches(shown, regexpr("JobState=[A-Z]+", shown))
    if (length(state) && state %in% c("JobState=COMPLETED", "JobState=FAILED",
                                       "JobState=CANCELLED", "JobState=TIMEOUT")) break
    if (Sys.time() > deadline) {
      run_command("scancel", job_id)
      fail(paste("job", job_id, "still running after 900 s:", paste(shown, collapse = " ")))
    }
    Sys.sleep(5)
  }
  output <- paste(readLines(log), collapse = "\n")
  expect_identical(state, "JobState=COMPLETED", info = output)
  # The first allocation cannot finish; a loaded machine may warn the
  # resumed one too: each warning saves once and requeues once.
  restarts <- as.integer(sub(".*Restarts=([0-9]+).*", "\\1", paste(shown, collapse = " ")))
  expect_gte(restarts, 1L)
  count <- function(pattern) lengths(regmatches(output, gregexpr(pattern, output)))
  expect_identical(count("caught SIGUSR1; saved the training state after batch [0-9]+ of epoch [0-9]+"),
                   restarts, info = output)
  expect_identical(count(paste0("Requeued Slurm job ", job_id, ": it runs the same script again")),
                   restarts, info = output)
  expect_match(output, paste("done, restarts:", restarts))
  # R ended cleanly after the save, not through an R error.
  expect_no_match(output, "SystemExit|Execution halted")
  expect_equal(readRDS(file.path(dir, "requeued.rds")), readRDS(file.path(dir, "unbroken.rds")),
               tolerance = 1e-6)
})
