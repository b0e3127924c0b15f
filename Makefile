# Two commands do all set-up on a fresh machine:
#   make demo   - trains a real model across 4 simulated devices
#   make test   - runs every test (Python core, R package, shared scenarios
#                 in both languages with the parity check, benchmark smoke run)
#   make docs   - builds the documentation site into out/site and checks it
SHELL := /bin/bash
PYTHON_BOOT ?= python3
# Two Python environments, one per NumPy major version (the core supports
# both; every version requirement is in pyproject.toml):
#   .venv         NumPy 1, with the numpy1 extra: for the R package on
#                 Debian's reticulate 1.28 (reticulate < 1.38 cannot use
#                 NumPy 2): its testthat run, the scenarios' R parity check
#                 (which runs every scenario in Python too: build, fit,
#                 predict, save and reload under NumPy 1), plus the data and
#                 message tests; also the demo's and the benchmarks'.
#   .venv-numpy2  NumPy 2, as Python users install it: the whole Python
#                 suite except the R parity check, and the R package on the
#                 current R stack (R CMD check, the documentation site).
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.installed
PY_TEST_STAMP := $(VENV)/.installed-test
NUMPY2_VENV := .venv-numpy2
PY_NUMPY2 := $(NUMPY2_VENV)/bin/python
PY_NUMPY2_STAMP := $(NUMPY2_VENV)/.installed-test
# The documentation site's tools (the docs extra: MkDocs, mkdocstrings,
# markdown-exec, selenium) go into .venv-numpy2, whose core and TensorFlow
# run the guides' examples: a third environment would install TensorFlow
# once more.
PY_DOCS := $(PY_NUMPY2)
PY_DOCS_STAMP := $(NUMPY2_VENV)/.installed-docs
SITE := out/site
NUMPY1_TESTS := tests/python/test_data.py tests/python/test_messages.py
# The scenarios' plain-R parity on Debian's R stack, outside `make test`
# for CI's time: the keras3 parity (test-python-keras3-parity) compares the
# same scenarios with Python through the R API as users run it today, and
# testthat on Debian's stack still runs every scenario in R.
NUMPY1_PARITY_TESTS := tests/python/test_scenario_parity.py::test_parity \
	tests/python/test_scenario_parity.py::test_parity_summary
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
# TensorFlow's C++ start-up chatter; errors still print.
export TF_CPP_MIN_LOG_LEVEL ?= 2

# R and the R packages the R package, its checks and the parity tests use
# (Debian's: CRAN is not needed). r-base-dev lets pip build rpy2.
R_DEBS := r-base-core r-base-dev r-cran-reticulate r-cran-generics \
	r-cran-magrittr r-cran-testthat r-cran-withr r-cran-jsonlite \
	r-cran-pkgload r-cran-knitr r-cran-rmarkdown r-cran-roxygen2 pandoc
R_PKGS := reticulate generics magrittr testthat withr jsonlite pkgload knitr \
	rmarkdown roxygen2

# What `make docs` adds (Debian's): pkgdown for the R pages, Chromium and
# its driver for the browser check, linkchecker, npm for the scripts
# pkgdown's pages load (.ci/docs-assets.sh). Only the missing ones are
# installed: Debian's npm conflicts with a Node.js the machine already has
# from elsewhere (NodeSource's nodejs ships its own npm).

.PHONY: demo test test-python test-python-numpy1 test-python-numpy1-parity \
	test-python-keras3-parity test-r test-r-beside-keras3-parity bench bench-quick \
	setup setup-python setup-test setup-numpy2 setup-r setup-r-current slurm-up lint \
	docs setup-docs setup-docs-debs

# Every environment `make test` uses, built side by side: pip into each
# virtual environment and R's compiler for the current R stack each keep
# about one core busy for two minutes. Debian's R comes first (apt, once);
# the current R stack's own apt step is then the only one running.
setup: setup-r
	@$(MAKE) --no-print-directory -j3 --output-sync=target \
	  setup-test setup-numpy2 setup-r-current

setup-python: $(PY_STAMP)

$(PY_STAMP): pyproject.toml
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[cpu,demo,numpy1]"
	touch $@

setup-r:
	@Rscript -e 'q(status = !all(vapply(strsplit("$(R_PKGS)", " ")[[1]], requireNamespace, NA, quietly = TRUE)))' 2>/dev/null \
	  && command -v pandoc >/dev/null \
	  || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	       $(SUDO) apt-get install -y -qq --no-install-recommends $(R_DEBS); }

# The current R stack, as R users install it from CRAN: reticulate >= 1.42,
# keras3, tensorflow and tfdatasets (NumPy 2 on the Python side). CRAN cannot
# be reached here, so they come as source tarballs from ../shared/r-vendor
# (its README), installed into a library of their own, $(R_CURRENT_LIB), so
# that Debian's reticulate 1.28 stays testable beside them.
R_VENDOR ?= ../shared/r-vendor
R_CURRENT_LIB := $(CURDIR)/.r-current
R_CURRENT_STAMP := $(R_CURRENT_LIB)/.installed
R_CURRENT_PKGS := reticulate config tfruns tfautograph tensorflow dotty keras3 tfdatasets
R_CURRENT_DEBS := r-cran-matrix r-cran-rcpp r-cran-rcpptoml r-cran-here \
	r-cran-jsonlite r-cran-png r-cran-rappdirs r-cran-rlang r-cran-withr \
	r-cran-processx r-cran-yaml r-cran-rstudioapi r-cran-lifecycle \
	r-cran-base64enc r-cran-magrittr r-cran-whisker r-cran-tidyselect \
	r-cran-backports r-cran-generics r-cran-zeallot r-cran-fastmap r-cran-glue \
	r-cran-cli

setup-r-current: $(R_CURRENT_STAMP)

$(R_CURRENT_STAMP): | setup-r
	@dpkg -s $(R_CURRENT_DEBS) >/dev/null 2>&1 \
	  || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	       $(SUDO) apt-get install -y -qq --no-install-recommends $(R_CURRENT_DEBS); }
	rm -rf $(R_CURRENT_LIB) && mkdir -p $(R_CURRENT_LIB)
	for p in $(R_CURRENT_PKGS); do \
	  MAKEFLAGS=-j$$(nproc) R CMD INSTALL --no-test-load -l $(R_CURRENT_LIB) $(R_VENDOR)/$${p}_*.tar.gz \
	    > $(R_CURRENT_LIB)/install-$$p.log 2>&1 \
	    || { tail -n 30 $(R_CURRENT_LIB)/install-$$p.log; exit 1; }; \
	done
	touch $@

# The test extra holds rpy2, which compiles against the installed R.
setup-test: $(PY_TEST_STAMP)

$(PY_TEST_STAMP): $(PY_STAMP) | setup-r
	$(PY) -m pip install --quiet -e ".[cpu,demo,test,numpy1]"
	touch $@

# What a Python user gets today: the newest NumPy, 2.x.
setup-numpy2: $(PY_NUMPY2_STAMP)

$(PY_NUMPY2_STAMP): pyproject.toml | setup-r
	$(PYTHON_BOOT) -m venv $(NUMPY2_VENV)
	$(PY_NUMPY2) -m pip install --quiet -e ".[cpu,demo,test]" "numpy>=2"
	touch $@

demo: setup-python
	$(PY) -m multigpu.demo --devices 4

test: setup test-python test-python-numpy1 test-r-beside-keras3-parity bench-quick

# ruff, configured in pyproject.toml, over the core, the tests and the
# benchmarks.
lint: setup-numpy2
	$(PY_NUMPY2) -m ruff check python tests bench

# `-m` replaces the one in pytest's addopts: keep the slow sweeps out here too.
# --durations lists the slowest tests, to keep CI within its time.
# pytest-xdist runs the tests in PYTEST_WORKERS processes: on CI's 2 cores
# two halve the wall time (much of a test is single-threaded tracing and
# subprocess start-up); each worker holds its own TensorFlow (about 1 GiB).
# The NumPy-1 set stays in one process: its parity summary reads what the
# parity tests before it recorded.
# The scenarios' Python runs (test_scenario_python.py) are left to
# test-python-keras3-parity, which runs each of them with the same checks
# before comparing it with R: `make test` runs them once.
PYTEST_WORKERS ?= 2
test-python: setup-numpy2 slurm-up
	$(PY_NUMPY2) -m pytest -q -m "not slow and not r_parity" --durations=25 \
	  -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_SKIP_SCENARIOS)

test: PYTEST_SKIP_SCENARIOS = --ignore=tests/python/test_scenario_python.py

test-python-numpy1: setup-test
	$(PY) -m pytest -q $(NUMPY1_TESTS)

test-python-numpy1-parity: setup-test
	$(PY) -m pytest -q $(NUMPY1_PARITY_TESTS)

# The shared scenarios through the keras3 R API (keras3's methods and
# constructors, tfdatasets), compared with their Python run: R embedded in a
# NumPy-2 pytest process of its own (keras3 changes S3 dispatch for the whole
# R session), on the current R stack.
test-python-keras3-parity: setup-numpy2 setup-r-current
	R_LIBS=$(R_CURRENT_LIB) $(PY_NUMPY2) -m pytest -q \
	  tests/python/test_scenario_parity_keras3.py

# The R package on both R stacks it supports: R CMD check (with testthat)
# on the current one (.r-current: reticulate 1.46, keras3, tensorflow,
# tfdatasets; NumPy 2), the zero-set-up path (a fresh environment through
# py_require() and uv), then testthat on Debian's (reticulate 1.28, NumPy 1,
# no keras3). The zero-set-up run waits mostly on uv (downloads, installs),
# the oldest stack's testthat on the CPU: they run side by side, the first
# one's output printed when both are done.
test-r: setup-test setup-numpy2 setup-r-current slurm-up
	R_LIBS=$(R_CURRENT_LIB) RETICULATE_PYTHON=$(CURDIR)/$(PY_NUMPY2) \
	  bash .ci/r-check.sh
	@PATH=$(CURDIR)/$(NUMPY2_VENV)/bin:$$PATH \
	  bash .ci/r-zero-setup-test.sh $$(ls out/r-check/multigpu_*.tar.gz) \
	  > out/r-zero-setup.log 2>&1 & zero=$$!; \
	bash .ci/r-test-oldest.sh; oldest=$$?; \
	wait $$zero; zero_status=$$?; \
	echo "== .ci/r-zero-setup-test.sh (run beside the oldest stack's tests)"; \
	cat out/r-zero-setup.log; \
	[ $$zero_status -eq 0 ] || echo "make: .ci/r-zero-setup-test.sh failed ($$zero_status)"; \
	[ $$oldest -eq 0 ] && [ $$zero_status -eq 0 ]

# The keras3 parity keeps one core busy (R embedded in one pytest process),
# as do test-r's first steps (roxygen2, R CMD build knitting the vignettes,
# the install test, R CMD check's own checks): `make test` runs the two side
# by side, the parity's output printed when both are done.
test-r-beside-keras3-parity: setup-test setup-numpy2 setup-r-current
	@mkdir -p out; \
	$(MAKE) --no-print-directory test-python-keras3-parity \
	  > out/keras3-parity.log 2>&1 & parity=$$!; \
	$(MAKE) --no-print-directory test-r; r_status=$$?; \
	wait $$parity; parity_status=$$?; \
	echo "== make test-python-keras3-parity (run beside test-r)"; \
	cat out/keras3-parity.log; \
	[ $$parity_status -eq 0 ] || echo "make: test-python-keras3-parity failed ($$parity_status)"; \
	[ $$r_status -eq 0 ] && [ $$parity_status -eq 0 ]

# The Slurm tests (srun -n2) need a single-node Slurm on this machine:
# .ci/slurm-up.sh installs Debian's slurm-wlm and munge and starts them (as
# root; idempotent). Where it cannot, those tests skip saying why; in CI
# (CI set) that is an error.
slurm-up:
	@$(if $(SUDO),sudo -n) bash .ci/slurm-up.sh || { [ -z "$${CI:-}" ] && \
	  echo "make: Slurm could not start here; the Slurm tests will skip."; }

bench: setup-test
	$(PY) -m bench --output docs/bench

# CI runs the harness once so it never rots: it must run and write its
# outputs (out/bench-quick); the numbers are not checked.
bench-quick: setup-test
	$(PY) -m bench --quick --output out/bench-quick

setup-docs: $(PY_DOCS_STAMP) setup-docs-debs

$(PY_DOCS_STAMP): $(PY_NUMPY2_STAMP)
	$(PY_DOCS) -m pip install --quiet -e ".[cpu,demo,test,docs]" "numpy>=2"
	touch $@

setup-docs-debs: setup-r
	@missing=; \
	Rscript -e 'q(status = !requireNamespace("pkgdown", quietly = TRUE))' 2>/dev/null \
	  || missing="$$missing r-cran-pkgdown"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	command -v linkchecker >/dev/null || missing="$$missing linkchecker"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	[ -z "$$missing" ] || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	  --no-install-recommends $$missing; }

# The site: MkDocs pages (guides whose examples run now, the Python API from
# the docstrings, the benchmarks) into out/site and, at the same time,
# pkgdown's R reference and articles (on the current R stack, keras3 with
# NumPy 2) into out/pkgdown, moved to out/site/r; then the checks: every
# link and image, every public name documented, no R example failed, and
# four pages in headless Chromium without console errors.
docs: setup-docs setup-python setup-r-current
	rm -rf $(SITE) out/pkgdown
	bash .ci/docs-assets.sh out/docs-assets
	@echo "pkgdown: building the R pages in the background (log: out/pkgdown.log)"
	@R_LIBS=$(R_CURRENT_LIB) RETICULATE_PYTHON=$(CURDIR)/$(PY_NUMPY2) Rscript -e \
	  'options(pkgdown.internet = FALSE); pkgdown::build_site(preview = FALSE)' \
	  > out/pkgdown.log 2>&1 & pkgdown=$$!; \
	NO_MKDOCS_2_WARNING=1 $(PY_DOCS) -m mkdocs build --strict; mkdocs=$$?; \
	wait $$pkgdown; status=$$?; \
	if [ $$status -ne 0 ]; then tail -n 40 out/pkgdown.log; echo "pkgdown failed ($$status)"; fi; \
	[ $$mkdocs -eq 0 ] && [ $$status -eq 0 ]
	mv out/pkgdown $(SITE)/r
	cp -r out/docs-assets/vendor $(SITE)/r/
	$(PY_DOCS) .ci/docs-check.py $(SITE)
	$(PY_DOCS) .ci/docs-browser-check.py $(SITE) out/docs-screenshots
