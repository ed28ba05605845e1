"""OpenCL runtime: device discovery, buffers, memory planning and the executor of delegated plans."""


class DeviceError(RuntimeError):
    """The OpenCL device failed while running a plan (out of resources, lost device, ...)."""


class ShapeError(RuntimeError):
    """An op of the subgraph refused the shapes it got while they were propagated (its message names it)."""


class EmptyTensorError(ShapeError):
    """A tensor of the subgraph has no elements at these input shapes (an empty batch): a device buffer cannot be
    empty, so the CPU kernels run such shapes (``Interpreter.allocate_tensors`` falls back to them)."""
