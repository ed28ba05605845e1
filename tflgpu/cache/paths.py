"""The cache directory (per user, private) and atomic file replacement."""

from __future__ import annotations

import errno
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


class CacheDirError(ValueError):
    """A cache directory that cannot be used (cannot be created, is a file, is not writable, is not private)."""

    def __init__(self, path: Path, why: str, named_by: str | None = None):
        by = f" (set by {named_by})" if named_by else ""
        super().__init__(f"the cache directory {path}{by} cannot be used: {why}; choose another directory, "
                         f"or run without the cache (GpuDelegate(cache=False))")
        self.path, self.why, self.named_by = path, why, named_by


def usable_cache_dir(path: Path, named_by: str | None = None) -> Path:
    """``private_dir(path)``, checked writable by creating a file there; any failure is one CacheDirError
    naming the directory (and the option or variable that set it), not an OS error from deep in a write."""
    path = Path(path)
    try:
        private_dir(path)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except UnsafeCacheDir as e:
        raise CacheDirError(path, str(e), named_by) from e
    except OSError as e:
        where = f" ({e.filename})" if e.filename and Path(e.filename) != path else ""
        raise CacheDirError(path, f"{e.strerror or e}{where}", named_by) from e
    return path


def read_only_cache_dir(path: Path, e: CacheDirError) -> bool:
    """Whether ``path``, refused by ``usable_cache_dir`` (``e``), is a private directory that can be read but not
    written: a read-only file system or mount (a cache warmed into an image that runs read-only), or a directory
    without write permission. What it holds can be used, and nothing new stored."""
    cause = e.__cause__
    if not (isinstance(cause, OSError) and cause.errno in (errno.EROFS, errno.EACCES, errno.EPERM)):
        return False
    try:
        private_dir(path)  # (it exists: nothing to create; one owned by another user, or open to others, is not used)
    except OSError:
        return False
    return os.access(path, os.R_OK | os.X_OK)


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
    if not path.is_dir():
        raise NotADirectoryError(20, "it is a file, not a directory", str(path))
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UnsafeCacheDir(f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDir(f"it is writable by others (mode {stat.S_IMODE(st.st_mode):o}: chmod 700 it)")
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
