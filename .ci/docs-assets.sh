#!/usr/bin/env bash
# The scripts and styles pkgdown's pages load, at the versions pkgdown 2.0.7
# pins, from npm into DIR/vendor (pkgdown/templates/head.html serves them
# from the site instead of CDNs). Idempotent: packages already fetched are
# not fetched again.
#
#   bash .ci/docs-assets.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir/npm" "$dir/vendor"
# name in vendor/  npm package@version  files kept (under the package)
assets=(
  "fontawesome @fortawesome/fontawesome-free@5.12.1 css/all.min.css css/v4-shims.min.css webfonts"
  "headroom headroom.js@0.11.0 dist/headroom.min.js dist/jQuery.headroom.min.js"
  "clipboard clipboard@2.0.6 dist/clipboard.min.js"
  "fuse fuse.js@6.4.6 dist/fuse.js"
  "autocomplete autocomplete.js@0.38.0 dist/autocomplete.jquery.min.js"
  "mark mark.js@8.11.1 dist/mark.min.js"
)
for asset in "${assets[@]}"; do
  read -r name package files <<<"$asset"
  target="$dir/vendor/$name"
  [ -e "$dir/npm/$name.fetched" ] && continue
  tarball=$(cd "$dir/npm" && npm pack --silent "$package" 2>/dev/null | tail -n 1)
  rm -rf "$target" && mkdir -p "$target"
  for file in $files; do
    # css/x.css keeps its folder (the fonts are found at ../webfonts);
    # dist/x.js lands in the asset's folder.
    case $file in
      dist/*) tar -xzf "$dir/npm/$tarball" -C "$target" --strip-components=2 "package/$file" ;;
      *) tar -xzf "$dir/npm/$tarball" -C "$target" --strip-components=1 "package/$file" ;;
    esac
  done
  touch "$dir/npm/$name.fetched"
done
