#!/usr/bin/env bash
# Zero set-up from R, as a new user of the current R stack meets it:
#
#   bash .ci/r-zero-setup-test.sh multigpu_0.1.0.tar.gz
#
# The tarball (from R CMD build) installed into an empty library, used with
# the R packages of $R_LIBS (make test: .r-lib: reticulate >= 1.42, keras3,
# tensorflow, tfdatasets) in a fresh user's environment: an empty
# HOME, no RETICULATE_PYTHON, MULTIGPU_PYTHON, r-multigpu environment or
# .venv, and uv (from PyPI, on the PATH) with UV_PYTHON_DOWNLOADS=never, so
# that it builds the environment on the machine's own Python, and a
# temporary cache.
#
# 1. A first R session: library(keras3); library(multigpu);
#    virtual_devices(2), then a keras3 model trains through
#    multi_gpu_model(gpus = 2): reticulate creates the environment from the
#    py_require() declarations of keras3 and multigpu. Timed. It prints no
#    line starting with "Error" (nor do sessions 2 and 2b).
# 2. A second session, the same script: reticulate reuses the cached
#    environment. Timed.
# 2b. The JAX backend: library(keras3); use_backend("jax");
#    library(multigpu), and the same training through the JAX engine.
#    reticulate builds a second environment from the JAX declarations
#    (keras3's JAX build, multigpu's `jax` extra), uv's cache already
#    holding the rest; the JAX there must be in the extra's range. Timed
#    (about 2 min: it downloads jaxlib). MULTIGPU_ZERO_SETUP_JAX=0 leaves it
#    out.
# 3. Without uv (none on the PATH, in HOME or reticulate's cache, and its
#    download blocked by a proxy on a closed local port, so nothing leaves
#    the machine): the first call is a multigpu_unavailable_error saying to
#    install uv or use install_multigpu().
set -euo pipefail
tarball=$(realpath "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
current_lib="${R_LIBS:?set R_LIBS to the library holding reticulate and keras3}"
uv=$(command -v uv || true)
if [ -z "$uv" ]; then
  echo "r-zero-setup-test: uv is not on the PATH (pip install uv)" >&2
  exit 1
fi
if [ ! -d "$current_lib/reticulate" ] || [ ! -d "$current_lib/keras3" ]; then
  echo "r-zero-setup-test: no reticulate and keras3 in $current_lib (make setup-r)" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/multigpu-zero.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== R CMD INSTALL into an empty library"
mkdir "$work/library"
R CMD INSTALL --no-test-load -l "$work/library" "$tarball" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; exit 1; }

mkdir -p "$work/home" "$work/elsewhere" "$work/no-uv" "$work/bin"
# uv alone on the PATH (its own directory may hold a Python, such as a venv's).
ln -s "$uv" "$work/bin/uv"
cd "$work/elsewhere"
rscript=$(command -v Rscript)
# A fresh user's environment: only what is set here (env -i), and the
# machine's network settings (certificates, proxies, package index).
network=()
for name in SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CURL_CA_BUNDLE \
    http_proxy https_proxy HTTP_PROXY HTTPS_PROXY no_proxy NO_PROXY \
    UV_INDEX_URL UV_DEFAULT_INDEX UV_INDEX UV_NATIVE_TLS UV_SYSTEM_CERTS; do
  if [ -n "${!name:-}" ]; then network+=("$name=${!name}"); fi
done
fresh_r() {
  local path="$1" libs="$2"
  shift 2
  env -i "${network[@]}" HOME="$work/home" PATH="$path" LANG="${LANG:-C.UTF-8}" \
    TMPDIR="${TMPDIR:-/tmp}" R_LIBS="$libs" R_USER_CACHE_DIR="$work/home/.cache" \
    UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$work/uv-cache" \
    TF_CPP_MIN_LOG_LEVEL=2 "$@" "$rscript" -e "$script"
}

# What a session printed (stdout and stderr, shown as it runs) holds no
# line that reads as an R error: it is the first thing a new user reads
# (reticulate's recovered C stack overflow printed one: R/python.R,
# start_python()).
no_error_lines() {
  if grep -nE '^Error' "$1" >&2; then
    echo "r-zero-setup-test: the $2 printed an error line (above)" >&2
    exit 1
  fi
}

# The same training in every session: a keras3 model on 2 simulated devices,
# 5 epochs of iris; its loss falls.
build='
virtual_devices(2)
set_random_seed(1)
model <- keras_model_sequential(input_shape = 4) |>
  layer_dense(8, activation = "relu") |>
  layer_dense(3, activation = "softmax")
parallel <- multi_gpu_model(model, gpus = 2)
'
train='
parallel |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
x <- scale(as.matrix(iris[, 1:4]))
y <- as.integer(iris$Species) - 1L
history <- parallel |> fit(x, y, epochs = 5, batch_size = 16, verbose = 0)
loss <- history$metrics$loss
cat("loss by epoch:", format(loss, digits = 4), "\n")
stopifnot(length(loss) == 5, all(is.finite(loss)), loss[5] < loss[1])
config <- multigpu_config()
print(config)
'
script='
library(keras3)
library(multigpu)
stopifnot(!reticulate::py_available())
'"$build$train"'
stopifnot(config$available, !nzchar(Sys.getenv("RETICULATE_PYTHON")),
          startsWith(config$versions[["tensorflow"]], "2.21."),
          identical(config$versions[["multigpu"]],
                    as.character(utils::packageVersion("multigpu"))))
# One distribution of TensorFlow in the environment, never two.
reticulate::py_run_string(paste(
  "import importlib.metadata as m",
  "def installed(name):",
  "    try: return bool(m.version(name))",
  "    except m.PackageNotFoundError: return False",
  "found = [n for n in (\"tensorflow\", \"tensorflow-cpu\", \"tensorflow-intel\", \"tensorflow-macos\") if installed(n)]",
  sep = "\n"))
tensorflows <- unlist(reticulate::py$found)
cat("TensorFlow distributions:", tensorflows, "\n")
stopifnot(length(tensorflows) == 1)
cat("zero set-up: OK\n")
'
path="$work/bin:$(dirname "$rscript"):/usr/local/bin:/usr/bin:/bin"
libs="$work/library:$current_lib"

echo "== first session: nothing configured, keras3 then multigpu, reticulate creates the environment"
start=$SECONDS
fresh_r "$path" "$libs" 2>&1 | tee "$work/first.log"
first=$((SECONDS - start))
no_error_lines "$work/first.log" "first session"
echo "== second session: the cached environment"
start=$SECONDS
fresh_r "$path" "$libs" 2>&1 | tee "$work/second.log"
second=$((SECONDS - start))
no_error_lines "$work/second.log" "second session"
echo "zero set-up: first session ${first} s, second session (cached) ${second} s"

jax_time="skipped (MULTIGPU_ZERO_SETUP_JAX=0)"
if [ "${MULTIGPU_ZERO_SETUP_JAX:-1}" = 1 ]; then
  echo "== the JAX backend: keras3::use_backend(\"jax\"), a second environment"
  script='
library(keras3)
use_backend("jax")
library(multigpu)
stopifnot(!reticulate::py_available())
'"$build"'
stopifnot(identical(parallel$engine, "jax"), isTRUE(parallel$sync_batchnorm))
'"$train"'
stopifnot(config$available, identical(config_backend(), "jax"))
# JAX in the range of the core'"'"'s jax extra (pyproject.toml, read from the
# installed core'"'"'s metadata).
reticulate::py_run_string(paste(
  "import importlib.metadata as m",
  "from packaging.requirements import Requirement",
  "extra = [Requirement(r) for r in m.requires(\"multigpu\") if r.startswith(\"jax\")]",
  "jax_range = str(extra[0].specifier)",
  "jax_in_range = extra[0].specifier.contains(m.version(\"jax\"))",
  sep = "\n"))
cat("JAX", config$versions[["jax"]], "in", reticulate::py$jax_range, "\n")
stopifnot(isTRUE(reticulate::py$jax_in_range))
cat("zero set-up on JAX: OK\n")
'
  start=$SECONDS
  fresh_r "$path" "$libs" 2>&1 | tee "$work/jax.log"
  jax_time="$((SECONDS - start)) s"
  no_error_lines "$work/jax.log" "JAX session"
fi

echo "== without uv: the first call says what to do"
script='
library(multigpu)
error <- tryCatch(virtual_devices(2), multigpu_unavailable_error = identity)
stopifnot(inherits(error, "multigpu_unavailable_error"))
message <- conditionMessage(error)
cat(message, "\n")
stopifnot(grepl("with uv, which is not installed", message),
          grepl("pip install uv", message, fixed = TRUE),
          grepl("install_multigpu()", message, fixed = TRUE))
cat("without uv: OK\n")
'
# No uv on this PATH; reticulate's download of it goes to a closed local port.
fresh_r "$(dirname "$rscript"):/usr/bin:/bin" "$work/library:$current_lib" \
  R_USER_CACHE_DIR="$work/no-uv" https_proxy=http://127.0.0.1:9 \
  http_proxy=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 ALL_PROXY=http://127.0.0.1:9

echo "zero set-up: first session ${first} s, second session (cached) ${second} s, JAX session ${jax_time}"
