"""The one exception a generator raises."""


class Unsupported(Exception):
    """This op (with these attributes/shapes) cannot run on the OpenCL path."""
