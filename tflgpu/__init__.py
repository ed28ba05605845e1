"""tflgpu: run TensorFlow Lite models through generated, tuned OpenCL kernels, with numba CPU kernels
for everything else. ``Interpreter`` is a drop-in for LiteRT's."""

from .delegate import GpuDelegate
from .interpreter import Interpreter, SignatureRunner
from .version import __version__

__all__ = ["GpuDelegate", "Interpreter", "SignatureRunner", "__version__"]
