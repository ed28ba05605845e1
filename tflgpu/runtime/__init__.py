"""OpenCL runtime: device discovery, buffers, memory planning and the executor of delegated plans."""


class DeviceError(RuntimeError):
    """The OpenCL device failed while running a plan (out of resources, lost device, ...)."""


class ShapeError(RuntimeError):
    """An op of the subgraph refused the shapes it got while they were propagated (its message names it)."""
