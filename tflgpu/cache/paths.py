"""The cache directory (per user, private) and atomic file replacement."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def default_cache_dir() -> Path:
    """``$TFLGPU_CACHE_DIR``, else platformdirs' user cache dir for tflgpu (e.g. ~/.cache/tflgpu)."""
    env = os.environ.get("TFLGPU_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("tflgpu", appauthor=False))


class UnsafeCacheDir(PermissionError):
    """The cache directory belongs to another user or others can write to it."""


def private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700, parents too) if needed, and refuse one that is not private:
    owned by another user, or writable by group or others (someone could plant binaries)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):  # every directory this creates is private, not just the last
        p.mkdir(mode=0o700, exist_ok=True)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UnsafeCacheDir(f"cache directory {path} is owned by uid {st.st_uid}, not by this user "
                             f"(uid {os.getuid()}); choose another serialization_dir")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDir(f"cache directory {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                             f"chmod 700 it or choose another serialization_dir")
    return path


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once (temp file in the same dir, fsync, rename; mode 0600).
    Readers see the old file or the new one, never a part."""
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
