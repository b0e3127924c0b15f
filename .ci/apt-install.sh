#!/usr/bin/env bash
# The one way this project installs from Debian: the packages named that are
# not installed yet (apt-get update first, once, only when something is
# missing). COMMAND=PACKAGE installs PACKAGE only when COMMAND is not on the
# PATH (a Node.js from elsewhere brings its own npm, which Debian's npm
# conflicts with). As root, or through sudo.
#
#   bash .ci/apt-install.sh PACKAGE... [COMMAND=PACKAGE...]
set -euo pipefail
missing=()
for package in "$@"; do
  if [[ $package == *=* ]]; then
    command -v "${package%%=*}" >/dev/null || missing+=("${package#*=}")
    continue
  fi
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)
echo "apt-install: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
