"""The cache directory (per user, private) and atomic file replacement."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def default_cache_dir() -> Path:
    """``$TFLGPU_CACHE_DIR``, else platformdirs' user cache dir for tflgpu (e.g. ~/.cache/tflgpu)."""
    env = os.environ.get("TFLGPU_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("tflgpu", appauthor=False))


def private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) if needed and return it."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once (temp file in the same dir, fsync, rename; mode 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
