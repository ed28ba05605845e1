"""OpenCL runtime: device discovery, buffers, memory planning and the executor of delegated plans."""


class DeviceError(RuntimeError):
    """The OpenCL device failed while running a plan (out of resources, lost device, ...)."""
