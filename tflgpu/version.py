"""The package's version, read from its installed metadata (pyproject.toml is the one place it is written)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tflgpu")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
