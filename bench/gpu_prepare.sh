#!/usr/bin/env bash
# Build, on this machine (which can reach PyPI and Debian), what a call on a lent GPU machine carries
# (bench/gpu_session.sh; the device tool's `carry`, 64 MiB in all):
#
#   .gpu/site.tar.xz  the Python packages tflgpu and its benches need that the GPU machine's image lacks, as one
#                     tree for PYTHONPATH (wheels for that machine's CPython 3.12, manylinux x86-64)
#   .gpu/models/      the corpus as stand-ins (bench/standin_models.py: graphs and small constants; the weights
#                     regenerated there), and the released models so: MediaPipe's 14, Basic Pitch's, openWakeWord's 8
#                     (python -m tflgpu.zoo --release NAME; 1.6 MB packed: BENCH_MODELS="/tmp/models/iris_landmark.tflite
#                     /tmp/models/nmp.tflite ..." times them there; their accuracy is tests/test_released_models.py's,
#                     on their real weights)
#   .gl/*.deb         the Vulkan loader LiteRT's GPU path (WebGPU over Vulkan) opens, and the GL dispatch libraries
#
#   bash bench/gpu_prepare.sh [MODELS_DIR]      (default ../shared/models; about a minute; prints the sizes)
#
# Both folders are build outputs: keep them out of git (.git/info/exclude) and name them in `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:-../shared/models}
py=${PYTHON:-.venv/bin/python}
# what the image holds already (the device tool's KINDS.md: numpy, numba, llvmlite, flatbuffers, xxhash, tqdm,
# pyyaml, filelock, pytest, pytest-xdist, hypothesis, typing-extensions, ...) is left out: only the rest
# travels, and its dependencies that the image lacks
packages=(pyopencl pytools platformdirs siphash24 optuna alembic sqlalchemy mako colorlog greenlet tflite
          threadpoolctl ai-edge-litert)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any -d "$work/whl" "${packages[@]}"
mkdir -p "$work/site" .gpu
for w in "$work"/whl/*.whl; do
    "$py" -m zipfile -e "$w" "$work/site"
done
tar -C "$work/site" -cJf .gpu/site.tar.xz .
rm -rf .gpu/models
"$py" bench/standin_models.py pack "$models" .gpu/models >/dev/null
"$py" -m tflgpu.zoo "$work/mediapipe" --mediapipe >/dev/null
"$py" -m tflgpu.zoo "$work/mediapipe" --release basic-pitch >/dev/null
"$py" -m tflgpu.zoo "$work/mediapipe" --release openwakeword >/dev/null
"$py" bench/standin_models.py pack "$work/mediapipe" .gpu/models >/dev/null
mkdir -p .gl
# (with the GL vendor-neutral dispatch libraries: on an H100 the NVIDIA Vulkan ICD, libGLX_nvidia, failed to load
# without them, "No adapters found")
(cd .gl && rm -f ./*.deb && apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null)
for d in .gpu .gl; do
    grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
du -sh .gpu/site.tar.xz .gpu/models .gl
