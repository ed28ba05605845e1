"""tflgpu: run TensorFlow Lite models through generated, tuned OpenCL kernels, with numba CPU kernels
for everything else. ``Interpreter`` is a drop-in for LiteRT's."""

from .delegate import GpuDelegate, load_delegate
from .interpreter import Interpreter, InterpreterWithCustomOps, OpResolverType, SignatureRunner
from .version import __version__

__all__ = ["GpuDelegate", "Interpreter", "InterpreterWithCustomOps", "OpResolverType", "SignatureRunner", "__version__",
           "load_delegate"]
