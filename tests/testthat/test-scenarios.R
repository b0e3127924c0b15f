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

test_that("the gate runs every recipe and every invalid input, whatever the rotation", {
  files <- scenario_files_for("tensorflow")
  recipe <- function(paths) vapply(paths, function(path) read_scenario(path)$recipe, "")
  invalid <- files[vapply(files, function(path) {
    invalid_input_scenario(read_scenario(path))
  }, logical(1))]
  withr::local_envvar(MULTIGPU_TEST_TIER = "gate")
  for (turn in 0:3) {
    gate <- gate_scenario_files(files, turn)
    expect_setequal(unique(recipe(gate)), unique(recipe(files)))
    expect_true(all(invalid %in% gate))
    expect_lt(length(gate), length(files))
  }
  withr::local_envvar(MULTIGPU_TEST_TIER = "full")
  expect_identical(gate_scenario_files(files), files)
})

# This process runs Keras on TensorFlow; the scenarios that also apply on
# JAX run there in test-jax.R's R process. The gate runs its sample of them
# (gate_scenario_files() in helper-tiers.R), the full tier all.
for (path in gate_scenario_files(scenario_files_for("tensorflow"))) {
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
