# The tiers of the R suite (helper-tiers.R): the gate reaches every zoo case
# and every engine, the test files run exactly the declared cases, and the
# tier's variables are checked.

# The zoo cases the test files run: zoo_engines("zoo", "case") calls.
zoo_calls_in_tests <- function() {
  files <- list.files(test_path(), "^test-.*\\.R$", full.names = TRUE)
  files <- files[basename(files) != "test-tiers.R"]
  text <- unlist(lapply(files, readLines))
  calls <- regmatches(text, gregexpr('zoo_engines\\("[^"]+", "[^"]+"\\)', text))
  calls <- unlist(calls)
  sprintf("%s/%s", sub('zoo_engines\\("([^"]+)".*', "\\1", calls),
          sub('.*, "([^"]+)"\\)', "\\1", calls))
}

declared_zoo_cases <- function() {
  unlist(lapply(names(r_zoos), function(zoo) sprintf("%s/%s", zoo, r_zoos[[zoo]]$cases)))
}

test_that("the test files run each declared zoo case once, and no other", {
  used <- zoo_calls_in_tests()
  expect_setequal(used, declared_zoo_cases())
  expect_false(anyDuplicated(used) > 0, label = "a zoo case run by two tests")
})

test_that("the gate runs every case and every engine of every zoo, whatever the rotation", {
  for (zoo in names(r_zoos)) {
    spec <- r_zoos[[zoo]]
    for (turn in 0:3) {
      sample <- gate_engines(spec$cases, spec$engines, turn)
      expect_true(all(lengths(sample) >= 1L),
                  label = sprintf("%s zoo, rotation %d: every case has an engine", zoo, turn))
      expect_setequal(unique(unlist(sample)), spec$engines)
    }
  }
})

test_that("the gate's rotation walks the engines along the cases", {
  sample <- gate_engines(c("a", "b", "c"), c("x", "y"))
  expect_identical(sample, list(a = "x", b = "y", c = "x"))
  expect_identical(gate_engines(c("a", "b", "c"), c("x", "y"), turn = 1L),
                   list(a = "y", b = "x", c = "y"))
  # Fewer cases than engines: the first case takes the engines left over.
  expect_identical(gate_engines("a", c("x", "y", "z")), list(a = c("x", "y", "z")))
  expect_identical(gate_engines(c("a", "b"), c("x", "y", "z")),
                   list(a = c("x", "z"), b = "y"))
})

test_that("zoo_engines() gives the gate's sample in the gate and every engine in the full tier", {
  withr::local_envvar(MULTIGPU_TEST_TIER = "gate", MULTIGPU_TEST_ROTATION = "")
  expect_identical(zoo_engines("layers", "normalization_adapt"), "replicate")
  expect_identical(zoo_engines("layers", "lstm_dropout"), "mirrored")
  withr::local_envvar(MULTIGPU_TEST_ROTATION = "1")
  expect_identical(zoo_engines("layers", "normalization_adapt"), "mirrored")
  withr::local_envvar(MULTIGPU_TEST_TIER = "full")
  expect_identical(zoo_engines("layers", "lstm_dropout"), r_zoos$layers$engines)
})

test_that("an undeclared zoo or case is an error naming it and the fix", {
  expect_error(zoo_engines("layers", "conv3d"),
               "case = \"conv3d\" is not a case of the layers zoo: add it to r_zoos$layers$cases",
               fixed = TRUE)
  expect_error(zoo_engines("losses", "mse"), "zoo = \"losses\" is not one of r_zoos",
               fixed = TRUE)
})

test_that("the tier's variables are checked, and only the full tier runs what the gate leaves out", {
  withr::local_envvar(MULTIGPU_TEST_TIER = "fast")
  expect_error(test_tier(), "MULTIGPU_TEST_TIER = \"fast\" is not a tier: use \"gate\"",
               fixed = TRUE)
  withr::local_envvar(MULTIGPU_TEST_TIER = "", MULTIGPU_TEST_ROTATION = "one")
  expect_identical(test_tier(), "gate")
  expect_error(test_rotation(), "MULTIGPU_TEST_ROTATION = \"one\" is not a whole number",
               fixed = TRUE)
  # skip_unless_full_tier()'s reason is the one .ci/r-check.sh accepts.
  reason <- tryCatch(skip_unless_full_tier("depth"),
                     skip = function(condition) conditionMessage(condition))
  expect_match(reason, "full tier only: depth", fixed = TRUE)
  withr::local_envvar(MULTIGPU_TEST_TIER = "full")
  expect_invisible(skip_unless_full_tier("depth"))
})
