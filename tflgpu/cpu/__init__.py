"""CPU kernels (numba and numpy) for every op, and the executor that runs them."""

from .executor import ModelRunner, SubgraphRunner
from .registry import supported_ops

__all__ = ["ModelRunner", "SubgraphRunner", "supported_ops"]
