"""tflgpu's private on-disk cache: where it lives and how files get written safely."""

from .paths import atomic_write, default_cache_dir, private_dir

__all__ = ["atomic_write", "default_cache_dir", "private_dir"]
