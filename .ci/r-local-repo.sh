#!/usr/bin/env bash
# A CRAN-like repository of the source tarballs in DIR (../shared/r-vendor
# on machines without CRAN), for R_REPOS: install.packages() then takes the
# same path from it as from CRAN. Prints the repository's URL.
#
#   R_REPOS=$(bash .ci/r-local-repo.sh ../shared/r-vendor out/r-repo)
set -euo pipefail
source_dir=$(realpath "$1")
repo=$(realpath -m "$2")
rm -rf "$repo" && mkdir -p "$repo/src/contrib"
cp "$source_dir"/*.tar.gz "$repo/src/contrib/"
Rscript -e 'tools::write_PACKAGES(commandArgs(TRUE)[1], type = "source")' \
  "$repo/src/contrib" >&2
echo "file://$repo"
