"""OpenCL runtime: device discovery, buffers, memory planning and the executor of delegated plans."""
