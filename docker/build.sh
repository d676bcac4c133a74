#!/usr/bin/env bash
# Build one image of docker/images.yaml with the versions pinned there.
# Usage: bash docker/build.sh TAG [docker build options...]   (run from anywhere; needs Docker)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tag="${1:?usage: bash docker/build.sh TAG [docker build options...]}"
shift
mapfile -t build < <(python3 - "$tag" <<'PY'
import sys
import yaml

tag = sys.argv[1]
images = {im["tag"]: im for im in yaml.safe_load(open("docker/images.yaml"))["images"]}
if tag not in images:
    sys.exit(f"unknown image {tag!r}; known: {', '.join(images)}")
im = images[tag]
print(im["dockerfile"])
for key, value in im["build"].items():
    print(f"{key}={value}")
PY
)
dockerfile="${build[0]}"
args=()
for kv in "${build[@]:1}"; do
  args+=(--build-arg "$kv")
done
printf 'docker build -f %s -t %s %s .\n' "$dockerfile" "$tag" "${args[*]}"
exec docker build -f "$dockerfile" -t "$tag" "${args[@]}" "$@" .
