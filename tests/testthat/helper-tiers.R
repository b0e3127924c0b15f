# The suite's two tiers in testthat, as tests/python/support/tiers.py has
# them in pytest: MULTIGPU_TEST_TIER is "gate" (make test, the default) or
# "full" (make test-full). A test whose point is depth runs in the full tier
# only (skip_unless_full_tier(), whose skip reason .ci/r-check.sh accepts in
# CI's gate and nowhere else); a zoo runs each case on the engines
# zoo_engines() gives: every engine in the full tier, a rotation along the
# cases in the gate that reaches every engine.

tier_variable <- "MULTIGPU_TEST_TIER"
rotation_variable <- "MULTIGPU_TEST_ROTATION"
full_tier_reason <- "full tier only"

# The zoos of the R suite: each one's cases, in order, and its engines. A
# case is run through zoo_engines(zoo, case); test-tiers.R checks that the
# test files call it for exactly these cases and that the gate reaches
# every case and every engine.
r_zoos <- list(
  layers = list(
    cases = c("normalization_adapt", "lstm_dropout"),
    engines = c("replicate", "mirrored")
  ),
  optimizers = list(
    cases = c("clipnorm", "use_ema", "mixed_float16_skipped_steps"),
    engines = c("replicate", "mirrored")
  ),
  published = list(
    cases = c("keras_hub_task"),
    engines = c("replicate", "mirrored")
  )
)

# The tier this run is: "gate" or "full".
test_tier <- function() {
  tier <- Sys.getenv(tier_variable, "gate")
  if (!nzchar(tier)) tier <- "gate"
  if (!tier %in% c("gate", "full")) {
    stop(sprintf(
      "%s = \"%s\" is not a tier: use \"gate\" (make test) or \"full\" (make test-full)",
      tier_variable, tier), call. = FALSE)
  }
  tier
}

# How far the gate's rotation is turned (MULTIGPU_TEST_ROTATION, 0 unset).
test_rotation <- function() {
  value <- Sys.getenv(rotation_variable, "0")
  if (!nzchar(value)) value <- "0"
  if (!grepl("^-?[0-9]+$", value)) {
    stop(sprintf(
      "%s = \"%s\" is not a whole number: unset it for the gate's own sample, or give one such as 1",
      rotation_variable, value), call. = FALSE)
  }
  as.integer(value)
}

# Skips the calling test unless the tier is "full"; `why` says what depth it
# adds to what the gate already runs.
skip_unless_full_tier <- function(why) {
  if (test_tier() == "full") return(invisible(TRUE))
  skip(paste0(full_tier_reason, ": ", why))
}

# The engines the gate runs for each of `cases` on `engines`, as
# gate_sample() in tests/python/support/tiers.py: case number i gets engine
# number (i + turn) mod k, then every engine no case has yet goes to the
# first case, so the gate reaches every case and every engine however few
# the cases are. A named list, case to engines.
gate_engines <- function(cases, engines, turn = 0L) {
  k <- length(engines)
  chosen <- lapply(seq_along(cases) - 1L, function(i) engines[(i + turn) %% k + 1L])
  unreached <- setdiff(engines, unlist(chosen))
  if (length(cases) > 0L && length(unreached) > 0L) {
    chosen[[1L]] <- c(chosen[[1L]], unreached)
  }
  stats::setNames(chosen, cases)
}

# The engines that `case` of zoo `zoo` (a name in r_zoos) runs on in this
# tier: all of them in the full tier, the gate's rotation otherwise.
zoo_engines <- function(zoo, case) {
  spec <- r_zoos[[zoo]]
  if (is.null(spec)) {
    stop(sprintf("zoo = \"%s\" is not one of r_zoos (%s): declare it in helper-tiers.R",
                 zoo, paste(names(r_zoos), collapse = ", ")), call. = FALSE)
  }
  if (!case %in% spec$cases) {
    stop(sprintf("case = \"%s\" is not a case of the %s zoo: add it to r_zoos$%s$cases in helper-tiers.R",
                 case, zoo, zoo), call. = FALSE)
  }
  if (test_tier() == "full") return(spec$engines)
  gate_engines(spec$cases, spec$engines, test_rotation())[[case]]
}

# The shared scenarios the gate runs with multigpu's R API: the ones the R
# parity step's gate leaves out (scenario_pairs() in
# tests/python/support/scenario_files.py; test_scenario_parity_keras3.py
# checks that the two together run every scenario). A recipe's valid
# scenarios, two at a time, make a pair: the parity step runs member
# (i + turn) mod k of pair i, this run the other one; an invalid-input
# scenario, cheap, runs in both. `files` in the full tier. A character
# vector, in the order of `files`.
gate_scenario_files <- function(files, turn = test_rotation()) {
  if (test_tier() == "full") return(files)
  seen <- list()
  cases <- vapply(files, function(path) {
    scenario <- jsonlite::fromJSON(path, simplifyVector = FALSE)
    if (invalid_input_scenario(scenario)) return(basename(path))
    count <- seen[[scenario$recipe]] %||% 0L
    seen[[scenario$recipe]] <<- count + 1L
    sprintf("%s-%d", scenario$recipe, count %/% 2L)
  }, character(1), USE.NAMES = FALSE)
  pairs <- split(seq_along(files), factor(cases, levels = unique(cases)))
  chosen <- unlist(Map(function(members, i) {
    members[(i + turn + 1L) %% length(members) + 1L]
  }, pairs, seq_along(pairs) - 1L))
  files[sort(chosen)]
}
