# The shared scenarios (tests/scenarios/*.json, format in its README.md), run
# with the R API. The Python suite runs the same files with the Python API
# and compares both runs' numbers and errors (tests/python/test_scenario_parity_keras3.py).
# The runner is in helper-scenarios.R.

test_that("the scenario files parse, with steps and one recipe each", {
  files <- scenario_files()
  expect_gte(length(files), 20L)
  for (path in files) {
    scenario <- read_scenario(path)
    expect_true(is.character(scenario$recipe), info = path)
    expect_gte(length(scenario$steps), 1L)
  }
})

# This process runs Keras on TensorFlow; the scenarios that also apply on
# JAX run there in test-jax.R's R process.
for (path in scenario_files_for("tensorflow")) {
  local({
    path <- path
    scenario <- read_scenario(path)
    test_that(sprintf("scenario %s: %s", scenario$name, scenario$description), {
      skip_if_no_multigpu()
      record <- run_scenario(path, tempfile(paste0("scenario-", scenario$name)))
      expect_type(record, "list")
    })
  })
}
