#!/usr/bin/env bash
# Install wheels into a --target folder that earlier wheel sets already fill (the GPU machine's
# /tmp/site, one set per device call), keeping what those sets put there:
#
#   bash tools/install_wheels.sh /tmp/site .whl/call2/*.whl
#
# `pip install --upgrade --target` replaces a top-level folder of the target whole when the new
# wheels have one of that name: a second set with console scripts (tilelang's, z3's) wiped bin/,
# and with it the first set's `ray` command. Here the new set goes to a folder of its own first;
# its bin/ scripts are then added beside the old ones, and each of its packages replaces only the
# package of the same name. Nothing is fetched (--no-index).
set -euo pipefail
target="$1"
shift
[ "$#" -gt 0 ] || exit 0
mkdir -p "$target"
fresh="$(mktemp -d "${target%/}.new.XXXXXX")"
trap 'rm -rf "$fresh"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$fresh" "$@"
if [ -d "$fresh/bin" ]; then
  mkdir -p "$target/bin"
  cp -a "$fresh/bin/." "$target/bin/"
  rm -rf "${fresh:?}/bin"
fi
shopt -s dotglob nullglob
for item in "$fresh"/*; do
  rm -rf "${target:?}/$(basename "$item")"
  mv "$item" "$target/"
done
