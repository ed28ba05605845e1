"""Per-op OpenCL C generators: op + shapes + precision + params -> KernelSpec (source, sizes, args)."""

from . import (  # noqa: F401  (registers the generators)
    attention,
    conv,
    elementwise,
    expand_depthwise,
    pool,
    pooled_dense,
    recurrent,
    reindex,
    separable,
    separable_expand,
    siblings,
    spectral,
    storage,
)
from .base import GenContext, Target, Unsupported, generator_for, gpu_ops
from .common import GENERATOR_VERSION, PREAMBLE, KernelSpec

__all__ = ["GENERATOR_VERSION", "PREAMBLE", "GenContext", "KernelSpec", "Target", "Unsupported", "generator_for", "gpu_ops"]
