#!/usr/bin/env bash
# Installs the R package as a user does and trains a model with it:
#
#   bash .ci/r-install-test.sh multigpu_0.1.0.tar.gz
#
# 1. The tarball (from R CMD build) carries the Python core of this checkout:
#    inst/python is identical to python/multigpu and pyproject.toml.
# 2. R CMD INSTALL into an empty library.
# 3. In an unrelated directory, with none of this checkout's settings
#    (no RETICULATE_PYTHON, MULTIGPU_PYTHON, PYTHONPATH) and a temporary
#    WORKON_HOME: multigpu::install_multigpu() creates r-multigpu.
# 4. A new R session there finds that environment by itself and trains a
#    model through multi_gpu_model() on 2 logical CPU devices.
#
# pip uses the machine's pip configuration (its index and wheel cache), as
# the repository's own .venv was built.
set -euo pipefail
tarball=$(realpath "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/multigpu-user.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== the tarball carries this checkout's Python core"
mkdir "$work/unpacked"
tar -xzf "$tarball" -C "$work/unpacked"
bundled="$work/unpacked/multigpu/inst/python"
diff -r -x __pycache__ -x '*.egg-info' "$root/python/multigpu" "$bundled/python/multigpu"
diff "$root/pyproject.toml" "$bundled/pyproject.toml"

echo "== R CMD INSTALL into an empty library"
mkdir "$work/library"
R CMD INSTALL --no-test-load -l "$work/library" "$tarball" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; exit 1; }

mkdir "$work/elsewhere"
cd "$work/elsewhere"
user_r() {
  env -u RETICULATE_PYTHON -u MULTIGPU_PYTHON -u PYTHONPATH -u VIRTUAL_ENV \
    WORKON_HOME="$work/envs" R_LIBS="$work/library:$R_LIBS" \
    R_USER_CACHE_DIR="$work/cache" \
    Rscript -e "$1"
}

echo "== install_multigpu() in $PWD"
start=$SECONDS
user_r 'multigpu::install_multigpu(demo = FALSE)'
echo "install_multigpu() took $((SECONDS - start)) s"

echo "== a model trains through multi_gpu_model()"
user_r '
library(keras3)
library(multigpu)
config <- multigpu_config()
print(config)
stopifnot(config$available,
          startsWith(config$python, Sys.getenv("WORKON_HOME")),
          identical(config$versions[["multigpu"]],
                    as.character(utils::packageVersion("multigpu"))))
virtual_devices(2)
set_random_seed(1)
model <- keras_model_sequential(input_shape = 4) |>
  layer_dense(8, activation = "relu") |>
  layer_dense(3, activation = "softmax")
parallel <- multi_gpu_model(model, gpus = 2)
parallel |> compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
x <- scale(as.matrix(iris[, 1:4]))
y <- as.integer(iris$Species) - 1L
history <- parallel |> fit(x, y, epochs = 5, batch_size = 16, verbose = 0)
loss <- history$metrics$loss
cat("loss by epoch:", format(loss, digits = 4), "\n")
stopifnot(length(loss) == 5, all(is.finite(loss)), loss[5] < loss[1])
cat("user install: OK\n")
'
