"""The entry store: one flatbuffers ``Entry`` file per cached thing, checked on every read.

Layout: ``<root>/v<FORMAT>/<device hash>/<kind>/<key>.bin``. A read checks the file identifier,
format version, kind, key, device identity (driver version included), the version an entry of its kind
is valid across (``entry_version``) and the xxh64 checksum; an entry failing any check is logged once, deleted,
and reported as a miss, so the caller rebuilds it and writes a good one (self-repair instead of "deserialization
failed" loops). Writes are atomic (temp file, fsync, rename); a read refreshes the file's mtime, which is the
"last use" that least-recently-used eviction goes by when the cache outgrows ``max_bytes``.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import flatbuffers
import xxhash

from ..kernels.common import GENERATOR_VERSION
from ..version import __version__
from .fb import Entry as fb_entry
from .paths import CacheDirError, atomic_write, default_cache_dir, private_dir, read_only_cache_dir, usable_cache_dir

log = logging.getLogger("tflgpu")

FORMAT = 1
KINDS = ("program", "plan", "tuning")
LIBRARY_VERSION = f"{__version__}+gen{GENERATOR_VERSION}"
# the entries' flatbuffers schema (the header's and the plan and tuning payloads'): what an entry valid across
# library versions must still be read with
SCHEMA_VERSION = "schema-" + xxhash.xxh64_hexdigest((Path(__file__).parent / "schema" / "cache.fbs").read_bytes())


def entry_version(kind: str) -> str:
    """What an entry of ``kind`` is written under and must be read under. A plan holds the whole library's
    decisions: this tflgpu's (LIBRARY_VERSION). A compiled program is content-addressed (its key hashes its exact
    source and build options, its device key the driver): the same under any tflgpu. A tuning record names the
    version of its kernel's generator itself (``TuningRecord.current``): an upgrade that changes one generator
    leaves the records of the others standing. Both of these need only the schema to be read."""
    return LIBRARY_VERSION if kind == "plan" else SCHEMA_VERSION


DEFAULT_MAX_BYTES = 1 << 30


MAX_ENTRY_BYTES = 1 << 30  # no single entry may claim more (a program binary is a few MB)


def read_private(path: Path, limit: int) -> bytes:
    """The bytes of a cache file, refusing (InvalidEntry) a symlink, anything not a regular file, a
    file of another user or writable by others, or one larger than ``limit``: never followed or loaded."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        if os.path.islink(path):
            raise InvalidEntry("is a symbolic link") from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidEntry("not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise InvalidEntry(f"owned by uid {st.st_uid}, not this user")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise InvalidEntry(f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        if st.st_size > limit:
            raise InvalidEntry(f"claims {st.st_size} bytes, over the {limit}-byte limit")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def _hash(s: str) -> str:
    return xxhash.xxh64_hexdigest(s.encode())


class InvalidEntry(Exception):
    pass


class OutdatedEntry(InvalidEntry):
    """An intact entry that another tflgpu, device or driver wrote: routine after an upgrade (logged at INFO, where
    damage is a warning)."""


@dataclass
class EntryInfo:
    path: Path
    kind: str
    key: str
    device_key: str
    size: int
    last_use: float
    created: float = 0.0
    problem: str | None = None  # None: the entry verifies
    payload: bytes | None = None


def _checksum(kind: str, key: str, device_key: str, library_version: str, payload: bytes) -> int:
    h = xxhash.xxh64()
    for part in (kind, key, device_key, library_version):
        h.update(part.encode())
        h.update(b"\0")
    h.update(payload)
    return h.intdigest()


def encode_entry(kind: str, key: str, device_key: str, payload: bytes, library_version: str | None = None,
                 format_version: int = FORMAT) -> bytes:
    """``library_version``: by default ``entry_version(kind)``."""
    library_version = entry_version(kind) if library_version is None else library_version
    b = flatbuffers.Builder(len(payload) + 512)
    strings = [b.CreateString(s) for s in (kind, key, device_key, library_version)]
    vec = b.CreateByteVector(payload)
    fb_entry.Start(b)
    fb_entry.AddFormatVersion(b, format_version)
    fb_entry.AddKind(b, strings[0])
    fb_entry.AddKey(b, strings[1])
    fb_entry.AddDeviceKey(b, strings[2])
    fb_entry.AddLibraryVersion(b, strings[3])
    fb_entry.AddCreated(b, time.time())
    fb_entry.AddPayload(b, vec)
    fb_entry.AddChecksum(b, _checksum(kind, key, device_key, library_version, payload))
    b.Finish(fb_entry.End(b), file_identifier=b"TFGC")
    return bytes(b.Output())


def decode_entry(data: bytes) -> tuple[dict, bytes]:
    """(header fields, payload) of an entry file; InvalidEntry if it is not a complete, intact entry."""
    if len(data) < 8 or not fb_entry.Entry.EntryBufferHasIdentifier(data, 0):
        raise InvalidEntry("not a tflgpu cache entry (bad identifier)")
    try:
        e = fb_entry.Entry.GetRootAs(data, 0)
        head = {"format_version": e.FormatVersion(), "kind": (e.Kind() or b"").decode(),
                "key": (e.Key() or b"").decode(), "device_key": (e.DeviceKey() or b"").decode(),
                "library_version": (e.LibraryVersion() or b"").decode(), "created": e.Created(),
                "checksum": e.Checksum()}
        payload = e.PayloadAsNumpy().tobytes() if e.PayloadLength() else b""
    except Exception as err:  # a truncated or mangled flatbuffer fails in many ways (struct, index, unicode)
        raise InvalidEntry(f"unreadable ({type(err).__name__})") from err
    if head["format_version"] != FORMAT:
        raise InvalidEntry(f"format version {head['format_version']}, expected {FORMAT}")
    if _checksum(head["kind"], head["key"], head["device_key"], head["library_version"], payload) != head["checksum"]:
        raise InvalidEntry("checksum mismatch")
    return head, payload


class CacheStore:
    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 named_by: str | None = None):
        """The cache in ``root`` (default: ``default_cache_dir()``); ``named_by``: what set the directory, for
        the CacheDirError raised when it cannot be used (when root is None: TFLGPU_CACHE_DIR if set)."""
        if root is None and named_by is None and os.environ.get("TFLGPU_CACHE_DIR"):
            named_by = "TFLGPU_CACHE_DIR"
        path = Path(root) if root is not None else default_cache_dir()
        try:
            self.root, self.read_only = usable_cache_dir(path, named_by), False
        except CacheDirError as e:
            if not (read_only_cache_dir(path, e) and (path / f"v{FORMAT}").is_dir()):
                raise  # (an unwritable directory holding no cache: a mistake more likely than a choice)
            # a cache warmed into an image run read-only: what it holds is read (plans, programs, tuning records);
            # nothing is written, removed or evicted
            self.root, self.read_only = path, True
            log.info("tflgpu cache: %s is read-only (%s): what it holds is used, nothing new is stored", path,
                     e.__cause__.strerror)
        if not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError("max_cache_bytes must be a positive int")
        self.max_bytes = max_bytes
        self.base = self.root / f"v{FORMAT}"
        self.stats = {"hits": 0, "misses": 0, "writes": 0, "repairs": 0, "evicted": 0}

    def path(self, kind: str, key: str, device_key: str) -> Path:
        if kind not in KINDS:
            raise ValueError(f"unknown cache entry kind {kind!r}")
        return self.base / _hash(device_key) / kind / f"{key}.bin"

    def get(self, kind: str, key: str, device_key: str) -> bytes | None:
        """The payload, or None (a miss, or an invalid entry: logged, removed, to be rebuilt)."""
        p = self.path(kind, key, device_key)
        try:
            self._check_dirs(p)
            data = read_private(p, min(self.max_bytes, MAX_ENTRY_BYTES))
        except FileNotFoundError:
            self.stats["misses"] += 1
            return None
        except InvalidEntry as e:
            self.discard(p, str(e))
            self.stats["misses"] += 1
            return None
        except OSError as e:
            log.warning("tflgpu cache: cannot read %s (%s); rebuilding it", p, e)
            self.stats["misses"] += 1
            return None
        try:
            head, payload = decode_entry(data)
            if (head["kind"], head["key"]) != (kind, key):
                raise InvalidEntry(f"holds {head['kind']} {head['key']}")
            if head["device_key"] != device_key:
                raise OutdatedEntry(f"built for another device or driver ({head['device_key']})")
            if head["library_version"] != entry_version(kind):
                raise OutdatedEntry(f"written under {head['library_version']}, this tflgpu reads {entry_version(kind)}")
        except InvalidEntry as e:
            self.discard(p, str(e), routine=isinstance(e, OutdatedEntry))
            self.stats["misses"] += 1
            return None
        try:
            os.utime(p)  # last use, for LRU eviction
        except OSError:
            pass
        self.stats["hits"] += 1
        return payload

    def _check_dirs(self, p: Path) -> None:
        """Every directory between the root and an entry must be a real directory (a planted symlink
        could point the cache anywhere): InvalidEntry otherwise."""
        d = p.parent
        while d != self.root and self.root in d.parents:
            if d.is_symlink():
                raise InvalidEntry(f"{d.relative_to(self.root)} is a symbolic link")
            d = d.parent

    def discard(self, p: Path, why: str, routine: bool = False) -> None:
        """Log one line (at INFO where ``routine``: an outdated entry, OutdatedEntry; else a warning) and remove an
        entry that cannot be used; the caller rebuilds and replaces it."""
        log.log(logging.INFO if routine else logging.WARNING, "tflgpu cache: ignoring %s: %s; it will be rebuilt",
                p.relative_to(self.root), why)
        self.stats["repairs"] += 1
        if self.read_only:
            return
        try:
            self._check_dirs(p)  # never remove anything through a planted directory link
            p.unlink()  # (a symlinked entry: removes the link, not its target)
        except (InvalidEntry, OSError):
            pass

    def put(self, kind: str, key: str, device_key: str, payload: bytes) -> None:
        if self.read_only:
            return
        p = self.path(kind, key, device_key)
        d = p.parent
        while d != self.root and self.root in d.parents:  # a planted symlinked directory: replace it
            if d.is_symlink():
                log.warning("tflgpu cache: removing the symbolic link %s", d.relative_to(self.root))
                d.unlink()
            d = d.parent
        private_dir(p.parent)
        atomic_write(p, encode_entry(kind, key, device_key, payload))
        self.stats["writes"] += 1
        self.evict()

    def entries(self, kinds: Collection[str] = KINDS, payloads: Collection[str] = ()) -> Iterator[EntryInfo]:
        """Every entry file of ``kinds`` (checked: ``problem`` says what is wrong with a bad one), keeping the
        payload of those of ``payloads`` (every file is read to be checked anyway)."""
        if not self.base.is_dir():
            return
        for dev_dir in sorted(self.base.iterdir()):
            for kind in kinds:
                d = dev_dir / kind
                if not d.is_dir():
                    continue
                for p in sorted(d.glob("*.bin")):
                    try:
                        st = p.lstat()
                    except OSError:
                        continue
                    info = EntryInfo(p, kind, p.stem, "", st.st_size, st.st_mtime)
                    try:
                        self._check_dirs(p)
                        head, payload = decode_entry(read_private(p, min(self.max_bytes, MAX_ENTRY_BYTES)))
                        info.device_key, info.created = head["device_key"], head["created"]
                        if (head["kind"], head["key"]) != (kind, p.stem):
                            info.problem = f"holds {head['kind']} {head['key']}"
                        elif _hash(head["device_key"]) != dev_dir.name:
                            info.problem = "device identity does not match its directory"
                        elif head["library_version"] != entry_version(kind):
                            info.problem = f"written under {head['library_version']}"
                        if kind in payloads:
                            info.payload = payload
                    except InvalidEntry as e:
                        info.problem = str(e)
                    except OSError as e:
                        info.problem = f"unreadable ({e.strerror or e})"
                    yield info

    def total_bytes(self) -> int:
        total = 0
        if self.base.is_dir():
            for dirpath, _, files in os.walk(self.base):
                for f in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, f)).st_size
                    except OSError:
                        pass
        return total

    def evict(self) -> int:
        """Remove least-recently-used entries until the cache fits ``max_bytes``; returns bytes freed."""
        files = []
        if self.read_only or not self.base.is_dir():
            return 0
        for dirpath, _, names in os.walk(self.base):
            for n in names:
                p = os.path.join(dirpath, n)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                files.append((st.st_mtime, st.st_size, p))
        total = sum(f[1] for f in files)
        freed = 0
        for _, size, p in sorted(files):
            if total - freed <= self.max_bytes:
                break
            try:
                os.unlink(p)
                freed += size
                self.stats["evicted"] += 1
            except FileNotFoundError:
                pass
        return freed

    def plans_of(self, token: str, entries: list[EntryInfo] | None = None) -> list[EntryInfo]:
        """The stored plans of one model token (plan keys are ``<token>-<options hash>``), among
        ``entries`` if given (else every entry)."""
        return [e for e in (self.entries() if entries is None else entries)
                if e.kind == "plan" and e.key.startswith(token + "-")]

    def remove(self, info: EntryInfo) -> None:
        if self.read_only:
            raise ValueError(f"the cache directory {self.root} is read-only: nothing can be removed from it")
        try:
            info.path.unlink()
        except FileNotFoundError:
            pass
