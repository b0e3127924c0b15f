#!/usr/bin/env bash
# Installs the `hub` extra (keras-hub) into the Python given, without
# tensorflow-text: on Linux and macOS that package requires the `tensorflow`
# distribution itself, a second copy of TensorFlow (~600 MB) beside
# tensorflow-cpu. No tested model needs it (KerasHub imports it only for
# its TF-Text tokenizers). The versions come from pyproject.toml and from
# keras-hub's own metadata, so nothing is written twice.
set -euo pipefail
PY=$1
spec=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["hub"][0])')
"$PY" -m pip install --quiet --no-deps "$spec"
mapfile -t deps < <("$PY" -c '
import importlib.metadata as metadata
for requirement in metadata.requires("keras-hub") or []:
    name, _, marker = requirement.partition(";")
    if "extra ==" not in marker and not name.startswith("tensorflow-text"):
        print(name.strip())')
"$PY" -m pip install --quiet "${deps[@]}"
