"""Reading .tflite flatbuffers into the graph IR (and writing them, for tests and tools)."""

from .reader import ModelBytes, read_model

__all__ = ["ModelBytes", "read_model"]
