"""tflgpu: run TensorFlow Lite models through generated, tuned OpenCL kernels, with numba CPU kernels
for everything else. ``Interpreter`` is a drop-in for LiteRT's."""

from .delegate import GpuDelegate
from .interpreter import Interpreter, SignatureRunner

__version__ = "0.1.0"
__all__ = ["GpuDelegate", "Interpreter", "SignatureRunner", "__version__"]
