# On a fresh machine two commands do all set-up:
#   make demo   - trains a real model across 4 simulated devices
#   make test   - runs every test: lint, the Python core, the R package (R CMD
#                 check, zero set-up, the scenarios' parity with Python), the
#                 benchmark smoke run and the documentation site's checks
# docs/ci.md maps each step to its environment, script and typical time.
SHELL := /bin/bash
PYTHON_BOOT ?= python3
# One Python environment (NumPy 2), for everything; every version
# requirement is in pyproject.toml.
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.installed
# The JAX suite's environments, one per JAX minor version of the `jax`
# extra's range (pyproject.toml): JAX 0.11 and 0.12 need Python 3.12 or
# newer, so they are made with JAX_PYTHON, the first of the machine's own
# Pythons (python3.12, python3.13, pyenv's) that is one.
# The gate runs the suite on the newest (JAX_VERSION); the full tier on each.
ifndef JAX_PYTHON
JAX_PYTHON := $(shell for python in python3.12 python3.13 $(wildcard $(HOME)/.pyenv/versions/3.1[23].*/bin/python3); do \
  $$python -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { echo $$python; break; }; done)
endif
JAX_VERSIONS := 0.10 0.11 0.12
JAX_VERSION ?= $(lastword $(JAX_VERSIONS))
JAX_VENV = .venv-jax-$(JAX_VERSION)
JAX_PY = $(JAX_VENV)/bin/python
JAX_PYTEST ?= $(JAX_PY) -m pytest
# The demo's part of it: the core, TensorFlow and scikit-learn (no root).
DEMO_STAMP := $(VENV)/.demo-installed
# rpy2, for the R parity step only (it compiles against R).
RPY2_STAMP := $(VENV)/.rpy2-installed
# The R packages R users install (reticulate >= 1.42, tensorflow, keras3,
# tfdatasets), from R_REPOS: CRAN by default. CI, which cannot reach CRAN,
# points it at a local repository of ../shared/r-vendor (.ci/run).
R_REPOS ?= https://cloud.r-project.org
R_LIB := $(CURDIR)/.r-lib
R_STAMP := $(R_LIB)/.installed
R_PACKAGES := reticulate tensorflow keras3 tfdatasets
# R itself and what R packages compile against or are tested, documented
# and checked with, from Debian (also the compiled dependencies of
# R_PACKAGES, which their repository then need not hold).
R_DEBS := r-base-dev pandoc r-cran-testthat r-cran-withr r-cran-jsonlite \
	r-cran-pkgload r-cran-knitr r-cran-rmarkdown r-cran-roxygen2 r-cran-pkgdown \
	r-cran-matrix r-cran-rcpp r-cran-rcpptoml r-cran-here r-cran-png \
	r-cran-rappdirs r-cran-rlang r-cran-processx r-cran-yaml \
	r-cran-rstudioapi r-cran-lifecycle r-cran-base64enc r-cran-magrittr \
	r-cran-whisker r-cran-tidyselect r-cran-backports r-cran-generics \
	r-cran-zeallot r-cran-fastmap r-cran-glue r-cran-cli
# The documentation site's browser and link checks; npm fetches the scripts
# pkgdown's pages load (.ci/docs-assets.sh).
DOCS_DEBS := chromium chromium-driver linkchecker npm=npm
export R_LIBS := $(R_LIB)
export RETICULATE_PYTHON := $(CURDIR)/$(PY)
export TF_CPP_MIN_LOG_LEVEL ?= 2
SITE := out/site
# The R package's tarball, as R CMD build names it (r-tarball).
R_VERSION := $(shell sed -n 's/^Version: *//p' DESCRIPTION)
R_TARBALL := out/r-check/multigpu_$(R_VERSION).tar.gz
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
# Each step says when it starts and ends, so a log shows where the time went.
START = @echo "== make $@: started $$(date +%T)"
END = @echo "== make $@: done $$(date +%T)"
PYTEST_WORKERS ?= 2
PYTEST ?= $(PY) -m pytest
# The suite's tier (docs/ci.md): `gate`, what `make test` and CI run, or
# `full`, every test (`make test-full`). Every step reads it from
# MULTIGPU_TEST_TIER: pytest (tests/python/support/tiers.py), testthat
# (tests/testthat/helper-tiers.R), the docs' R examples.
TIER ?= gate
export MULTIGPU_TEST_TIER := $(TIER)

.PHONY: demo test test-full coverage coverage-compare setup setup-debs setup-python setup-r lint test-python \
	test-python-jax test-python-jax-versions setup-python-jax r-tarball test-r test-r-install test-r-check test-r-parity test-r-zero-setup bench bench-quick docs slurm-up gpu-check gpu-bundle

# The core, TensorFlow and scikit-learn only: no apt, no root.
demo: $(DEMO_STAMP)
	$(PY) -m multigpu.demo --devices 4

$(DEMO_STAMP): pyproject.toml
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[cpu,demo]"
	touch $@

# The Debian packages first (one apt step), then pip and R's compiler side
# by side: each keeps about one core busy.
setup: setup-debs
	$(START)
	@$(MAKE) --no-print-directory -j3 --output-sync=target setup-python setup-r setup-python-jax
	$(END)

setup-debs:
	bash .ci/apt-install.sh $(R_DEBS) $(DOCS_DEBS)

setup-python: $(PY_STAMP)

# One JAX suite environment (JAX_VERSION): TensorFlow beside JAX, as in
# .venv, for the suite's comparisons with TensorFlow runs.
setup-python-jax: $(JAX_VENV)/.installed

$(JAX_VENV)/.installed: pyproject.toml
	@[ -n "$(JAX_PYTHON)" ] || { echo "setup-python-jax: no Python 3.12 or newer here (python3.12, python3.13, pyenv's): the JAX suite runs on one (JAX 0.11 and 0.12 need it); set JAX_PYTHON to one" >&2; exit 1; }
	$(JAX_PYTHON) -m venv $(JAX_VENV)
	$(JAX_PY) -m pip install --quiet -e ".[cpu,test,jax]" "jax==$(JAX_VERSION).*"
	touch $@

# Everything the Python steps use; nothing here compiles against R, so
# no apt and no root (rpy2 comes with the R parity step: $(RPY2_STAMP)).
$(PY_STAMP): pyproject.toml $(DEMO_STAMP)
	$(PY) -m pip install --quiet -e ".[cpu,demo,test,docs,jax]"
	bash .ci/install-hub.sh $(PY)
	touch $@

# rpy2 compiles against R: after setup-r's Debian packages (r-base-dev).
$(RPY2_STAMP): $(PY_STAMP) $(R_STAMP)
	$(PY) -m pip install --quiet -e ".[r-parity]"
	touch $@

setup-r: $(R_STAMP)

$(R_STAMP):
	bash .ci/apt-install.sh $(R_DEBS)
	mkdir -p $(R_LIB)
	Rscript -e 'options(warn = 2); install.packages(strsplit("$(R_PACKAGES)", " ")[[1]], lib = "$(R_LIB)", repos = "$(R_REPOS)", Ncpus = 2, quiet = TRUE)'
	Rscript -e 'library(keras3); library(tfdatasets); stopifnot(packageVersion("reticulate") >= "1.42")'
	touch $@

# Every step CI runs; each step can also be run alone. After set-up, lint,
# the R package's tarball and the local Slurm (which two steps use), every
# step at the same time in one pool: the
# Python suite's two workers leave a core idle for a tenth of their time
# (tests waiting on processes and timers) and the R check is one R process
# for minutes, so steps run one after another leave cores idle. The Python
# suite and the R check, the two longest, run at normal priority; the other
# steps at nice 10 take the cores they leave. (At nice 19 they fell so far
# behind that they ended 1.5 to 3 min after the suite. nice ranks processes
# within one session; what callr or processx starts runs in a session of
# its own, which Linux's autogroups give an equal share.) beside.sh ends
# with each step's wall and CPU time.
BESIDE_NICE := nice -n 10 $(MAKE) --no-print-directory
test: setup lint
	$(MAKE) --no-print-directory r-tarball
	$(MAKE) --no-print-directory slurm-up
	bash .ci/beside.sh "$(MAKE) --no-print-directory test-python" \
	  "$(MAKE) --no-print-directory test-r-check" \
	  "$(BESIDE_NICE) docs" \
	  "$(BESIDE_NICE) test-r-parity" \
	  "$(BESIDE_NICE) test-python-jax-versions" \
	  "$(BESIDE_NICE) test-r-zero-setup" \
	  "$(BESIDE_NICE) bench-quick" \
	  "$(BESIDE_NICE) test-r-install"

# Every test there is: the same steps as `make test`, in the full tier (the
# zoos' whole products, the soaks, every SIGKILL point and Slurm case).
test-full:
	$(MAKE) --no-print-directory test TIER=full

# ruff, configured in pyproject.toml, over the core, the tests and the
# benchmarks.
lint: setup-python
	$(START)
	$(PY) -m ruff check python tests bench
	$(END)

# Two pytest-xdist workers halve the wall time on CI's 2 cores; the slow
# sweeps, the R parity (test-r-parity) and the checks of the benchmark
# harness's outputs (bench-quick) are left out; --durations lists the
# slowest tests, to keep CI within its time.
test-python: setup-python slurm-up
	$(START)
	$(PYTEST) -q -m "not slow and not r_parity and not bench_quick" --durations=30 \
	  -n $(PYTEST_WORKERS) --dist worksteal \
	  --ignore=tests/python/test_scenario_python.py \
	  --ignore=tests/python/engines/jax
	$(END)

# The JAX engine's tests, in a pytest process of their own: Keras chooses
# its backend once per process, at import (test-python leaves them out).
# Two of its workers join across processes under Slurm's srun (slurm-up).
# The shared scenarios that name JAX run there too, each compared with its
# run on TensorFlow, which one child process of that pytest makes meanwhile
# (tests/python/engines/jax/test_jax_scenarios.py).
# On JAX_VERSION (the newest by default); test-python-jax-versions runs it on
# the tier's versions: the newest in the gate, each one in the full tier.
test-python-jax: setup-python-jax slurm-up
	$(START)
	@$(JAX_PY) -c 'import jax; print("JAX", jax.__version__)'
	KERAS_BACKEND=jax $(JAX_PYTEST) -q --durations=5 tests/python/engines/jax
	$(END)

JAX_TIER_VERSIONS = $(if $(filter full,$(TIER)),$(JAX_VERSIONS),$(JAX_VERSION))
test-python-jax-versions:
	@for version in $(JAX_TIER_VERSIONS); do \
	  $(MAKE) --no-print-directory test-python-jax JAX_VERSION=$$version || exit 1; \
	done

# Line and branch coverage of python/multigpu under the tier's two pytest
# steps, worker processes included (coverage.py's `patch = ["subprocess"]`,
# pyproject.toml), into out/coverage/TIER.json; `make coverage-compare`
# (after a gate and a full run) gives the gate's share of the full run's
# lines and branches (docs/ci.md).
COVERAGE_DIR := $(CURDIR)/out/coverage
coverage: setup-python setup-python-jax slurm-up
	$(START)
	rm -rf $(COVERAGE_DIR)/$(TIER) && mkdir -p $(COVERAGE_DIR)/$(TIER)
	export COVERAGE_FILE=$(COVERAGE_DIR)/$(TIER)/data; \
	  $(MAKE) --no-print-directory test-python PYTEST="$(PY) -m coverage run -m pytest" && \
	  $(MAKE) --no-print-directory test-python-jax JAX_PYTEST="$(JAX_PY) -m coverage run -m pytest" && \
	  $(PY) -m coverage combine -q && \
	  $(PY) -m coverage json -q -o $(COVERAGE_DIR)/$(TIER).json
	$(END)

# On a machine with NVIDIA GPUs (JAX, with or without TensorFlow): device
# discovery, the engine's step beside Keras's fit, memory_plan and
# find_batch_size against the device's memory, mixed precision and XLA
# against float32, scaling; one table and out/gpu-check.json
# (docs/benchmarks.md). Its small case runs in the full tier
# (tests/python/test_gpu_check.py).
gpu-check:
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) -m bench.gpu_check --out out/gpu-check.json

# The wheels an offline GPU node with JAX needs for multigpu (Keras, its
# dependencies, the package), for Python PYTHON_VERSION, into BUNDLE, at
# most 32 MiB (docs/cluster.md#an-offline-gpu-node).
PYTHON_VERSION ?= 3.12
BUNDLE ?= out/gpu-bundle
gpu-bundle:
	$(PYTHON_BOOT) .ci/gpu-bundle.py --python-version $(PYTHON_VERSION) --out $(BUNDLE)

coverage-compare:
	$(PY) .ci/coverage-compare.py $(COVERAGE_DIR)/gate.json $(COVERAGE_DIR)/full.json

# The R package: the tarball (r-tarball) installed as a user installs it
# (test-r-install), then R CMD check with testthat (test-r-check); `make
# test` runs the two at the same time.
test-r: test-r-install test-r-check

test-r-install: setup $(R_TARBALL)
	$(START)
	bash .ci/r-check.sh install
	$(END)

test-r-check: setup $(R_TARBALL)
	$(START)
	bash .ci/r-check.sh check
	$(END)

# The R package's tarball: NAMESPACE and man/ as roxygen2 writes them,
# then R CMD build (the vignettes are knitted once, by pkgdown in `make
# docs`), into out/r-check; made again when the package's sources are newer.
r-tarball: $(R_TARBALL)

$(R_TARBALL): DESCRIPTION NAMESPACE pyproject.toml $(shell find R man vignettes \
	  tests/testthat tests/testthat.R tests/scenarios tests/shared inst python/multigpu \
	  -type f -not -path '*/__pycache__/*') | setup-r
	$(START)
	bash .ci/r-check.sh build
	$(END)

# The shared scenarios through the keras3 R API (R embedded in a pytest
# process of its own) compared with their Python run, which checks each one
# with the same checks as test_scenario_python.py.
test-r-parity: setup $(RPY2_STAMP)
	$(START)
	$(PY) -m pytest -q tests/python/test_scenario_parity_keras3.py
	$(END)

# A fresh R session with nothing configured trains after library(keras3);
# library(multigpu) (reticulate builds the environment with uv); installs
# the tarball r-tarball made.
test-r-zero-setup: setup $(R_TARBALL)
	$(START)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash .ci/r-zero-setup-test.sh $(R_TARBALL)
	$(END)

# The Slurm tests need a single-node Slurm: .ci/slurm-up.sh installs and
# starts it (as root; idempotent). Where it cannot, those tests skip saying
# why; in CI (CI set) that is an error.
slurm-up:
	@$(if $(SUDO),sudo -n) bash .ci/slurm-up.sh || { [ -z "$${CI:-}" ] && \
	  echo "make: Slurm could not start here; the Slurm tests will skip."; }

# Every measurement, written into docs/bench (the tests of bench/ check
# only its plumbing, on the smallest inputs): the main comparison (the
# lockstep harness, bench/lockstep/), then each question of
# docs/benchmarks.md in a run of its own (the cost studies through one
# paired runner, bench/paired.py).
BENCH_SIDES := communication fixed_cost kernel_floor blas_split monitor_cost \
	sync_batchnorm_cost guard_cost zero_row_padding jax_throughput xla \
	mixed_precision mirrored_vs_hand jax_guard_cost jax_process_placement
bench: setup-python
	$(PY) -m bench.lockstep --output docs/bench
	set -e; for side in $(BENCH_SIDES); do \
	  $(PY) -m bench.$$side --output docs/bench/$$(echo $$side | tr _ -); \
	done

# The harness runs once so it never rots: it must run and write its outputs
# (out/bench-quick), and so must the JAX study (its workers on JAX), which
# test_bench.py's bench_quick tests then check (they run here, not in
# test-python); the numbers are not checked. In the full tier, one
# configuration per kind of worker (plain Keras, multi_gpu_model with its
# twin, MirroredStrategy by hand, R): the other engines run the same worker
# code; the gate runs the first two, which every comparison needs.
comma := ,
BENCH_QUICK_CONFIGS = plain,default$(if $(filter full,$(TIER)),$(comma)mirrored_by_hand$(comma)r)
bench-quick: setup-python
	$(START)
	$(PY) -m bench.lockstep --quick --rounds 1 \
	  --configs $(BENCH_QUICK_CONFIGS) --output out/bench-quick
	$(PY) -m bench.jax_throughput --quick --output out/bench-quick/jax-throughput
	MULTIGPU_BENCH_QUICK_OUTPUT=out/bench-quick $(PY) -m pytest -q -m bench_quick \
	  tests/python/test_bench.py
	$(END)

# The site: MkDocs pages (guides whose examples run now, the Python API from
# the docstrings, the benchmarks) into out/site and, at the same time,
# pkgdown's R reference and articles into out/pkgdown (.ci/pkgdown-site.R:
# the tier decides which R examples run), moved to out/site/r;
# then the checks: every link and image, every public name documented, no R
# example failed, and four pages in headless Chromium without console
# errors.
docs: setup
	$(START)
	rm -rf $(SITE) out/pkgdown
	bash .ci/docs-assets.sh out/docs-assets
	bash .ci/beside.sh "NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict" \
	  "Rscript .ci/pkgdown-site.R"
	mv out/pkgdown $(SITE)/r
	cp -r out/docs-assets/vendor $(SITE)/r/
	$(PY) .ci/docs-check.py $(SITE)
	$(PY) .ci/docs-browser-check.py $(SITE) out/docs-screenshots
	$(END)
