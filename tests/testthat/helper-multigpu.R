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
