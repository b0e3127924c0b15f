#!/usr/bin/env bash
# The R package's testthat suite on the oldest R stack it supports:
#
#   bash .ci/r-test-oldest.sh
#
# Debian 12's R 4.2 with its reticulate 1.28 (NumPy < 2 only, so the
# repository's NumPy-1 .venv), and none of keras3, tensorflow or tfdatasets:
# the R library path holds only R's own and Debian's libraries. The package
# is installed from this checkout into a temporary library; the tests that
# need keras3 skip saying so, and any other skip fails in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export RETICULATE_PYTHON="${RETICULATE_PYTHON_OLDEST:-$root/.venv/bin/python}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
unset R_LIBS R_LIBS_USER
work=$(mktemp -d "${TMPDIR:-/tmp}/multigpu-oldest.XXXXXX")
trap 'rm -rf "$work"' EXIT

reticulate=$(Rscript -e 'cat(format(packageVersion("reticulate")))')
echo "== R $(Rscript -e 'cat(format(getRversion()))'), reticulate $reticulate," \
  "Python $RETICULATE_PYTHON"
if Rscript -e 'q(status = !requireNamespace("keras3", quietly = TRUE))' 2>/dev/null; then
  echo "r-test-oldest: keras3 is installed in the system library; this run" \
       "must be without it" >&2
  exit 1
fi

echo "== R CMD INSTALL into a temporary library"
R CMD INSTALL --no-test-load -l "$work" . >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; exit 1; }

echo "== testthat"
R_LIBS="$work" Rscript -e '
results <- testthat::test_dir(
  "tests/testthat", package = "multigpu", load_package = "installed",
  reporter = "summary", stop_on_failure = FALSE, stop_on_warning = FALSE)
outcomes <- unlist(lapply(results, function(test) lapply(test$results, function(e) {
  kind <- if (inherits(e, "expectation_skip")) "skip"
    else if (inherits(e, c("expectation_failure", "expectation_error"))) "fail"
    else if (inherits(e, "expectation_warning")) "warn"
    else "pass"
  setNames(conditionMessage(e), kind)
})))
skips <- outcomes[names(outcomes) == "skip"]
counts <- table(factor(names(outcomes), c("pass", "fail", "warn", "skip")))
cat(sprintf("R testthat (oldest stack): %d passed, %d failed, %d warned, %d skipped\n",
            counts[["pass"]], counts[["fail"]], counts[["warn"]], counts[["skip"]]))
# Here only keras3 (and the packages of its stack) may be missing.
other <- skips[!grepl("keras3", skips)]
for (reason in unique(skips)) cat("  skipped:", reason, "\n")
ci <- nzchar(Sys.getenv("CI"))
quit(status = as.integer(counts[["fail"]] > 0 ||
                         (ci && (length(other) > 0 || counts[["warn"]] > 0))))
'
