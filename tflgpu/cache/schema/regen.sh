#!/bin/sh
# Regenerate the flatbuffers accessors in tflgpu/cache/fb/ from cache.fbs (needs flatc, e.g. Debian's
# flatbuffers-compiler); run from the repository root. Imports are made package-relative.
set -eu
tmp=$(mktemp -d)
flatc --python -o "$tmp" tflgpu/cache/schema/cache.fbs
rm -rf tflgpu/cache/fb
mkdir tflgpu/cache/fb
for f in "$tmp"/tflgpu_cache/*.py; do
  sed 's/from tflgpu_cache\./from ./' "$f" > "tflgpu/cache/fb/$(basename "$f")"
done
echo '"""flatc-generated accessors for tflgpu/cache/schema/cache.fbs (regenerate with its regen.sh)."""' \
  > tflgpu/cache/fb/__init__.py
rm -rf "$tmp"
