# The R site (pkgdown, into out/pkgdown) for `make docs`, in the tier that
# MULTIGPU_TEST_TIER names (docs/ci.md). Both tiers knit every vignette and
# article. The full tier runs the examples of every help topic; the gate,
# those of every third topic, in turn along man/ with MULTIGPU_TEST_ROTATION
# (test_rotation() of tests/testthat/helper-tiers.R), and shows the rest's
# code (R CMD check runs none: .ci/r-check.sh).
# .ci/docs-check.py then fails on any example that printed an error.
#
#   MULTIGPU_TEST_TIER=full Rscript .ci/pkgdown-site.R
source(file.path("tests", "testthat", "helper-tiers.R"))
options(pkgdown.internet = FALSE)

if (test_tier() == "full") {
  pkgdown::build_site(preview = FALSE)
} else {
  rd <- list.files("man", pattern = "\\.Rd$", full.names = TRUE)
  with_examples <- rd[vapply(rd, function(path) {
    any(grepl("^\\\\examples\\{", readLines(path, warn = FALSE)))
  }, logical(1))]
  topics <- sort(sub("\\.Rd$", "", basename(with_examples)))
  # Every third topic, turned by the rotation: topic i (from 0) runs when
  # (i + rotation) mod 3 is 0.
  run <- topics[(seq_along(topics) - 1L + test_rotation()) %% 3L == 0L]
  pkgdown::build_site(preview = FALSE, examples = FALSE)
  pkgdown::build_reference(topics = run, examples = TRUE, preview = FALSE)
  message(sprintf(
    "pkgdown: tier gate, rotation %d: ran the examples of %d of %d help topics (%s); MULTIGPU_TEST_TIER=full runs them all",
    test_rotation(), length(run), length(topics), paste(run, collapse = ", ")))
}
