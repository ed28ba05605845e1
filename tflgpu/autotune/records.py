"""Tuning records: per device identity and kernel identity, the chosen parameters and measured times.

A record is only valid for the version of its kernel's generator it was measured with (``TuningRecord.current``):
a changed generator may emit different code for the same parameters, so older records are ignored (and replaced
by the next tuning run); the records of kernels whose generators did not change stay.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import xxhash
from filelock import FileLock, Timeout

from ..cache import atomic_write, private_dir
from ..cache.plans import decode_tuning, encode_tuning
from ..cache.records import TuningRecord
from ..cache.store import CacheStore, InvalidEntry

log = logging.getLogger("tflgpu")

FORMAT = 1


class TuningDB:
    """Where records live. ``get`` ignores records of another generator version."""

    def get(self, device_key: str, kernel_key: str) -> TuningRecord | None:
        rec = self._records().get(device_key, {}).get(kernel_key)
        if rec is None or not rec.current:
            return None
        return rec

    def put(self, device_key: str, kernel_key: str, record: TuningRecord) -> None:
        self.put_many(device_key, {kernel_key: record})

    def put_many(self, device_key: str, records: dict[str, TuningRecord]) -> None:
        raise NotImplementedError

    def items(self):
        """(device_key, kernel_key, record) for every stored record, valid or not."""
        for dev, recs in self._records().items():
            for key, rec in recs.items():
                yield dev, key, rec

    def _records(self) -> dict[str, dict[str, TuningRecord]]:
        raise NotImplementedError

    @contextmanager
    def claim(self, device_key: str, kernel_key: str) -> Iterator[bool]:
        """Within the block, True if this caller may search the kernel: no other searcher (thread here, or
        process where the records are shared) holds it. False: someone else is searching it now."""
        key = (self._claim_scope(), device_key, kernel_key)
        with _CLAIMS_LOCK:
            free = key not in _CLAIMS
            _CLAIMS.add(key)
        try:
            with self._claim_shared(device_key, kernel_key) as ok:
                yield free and ok
        finally:
            if free:
                with _CLAIMS_LOCK:
                    _CLAIMS.discard(key)

    @contextmanager
    def _claim_shared(self, device_key: str, kernel_key: str) -> Iterator[bool]:
        yield True  # records only this process sees: the in-process claim is enough

    def _claim_scope(self) -> object:
        """Whose searchers an in-process claim keeps apart: every searcher in the process (None), unless the
        records are this object's alone (``MemoryTuningDB``: a searcher whose result another could not read
        gains nothing by waiting for it)."""
        return None


_CLAIMS: set[tuple[object, str, str]] = set()
_CLAIMS_LOCK = threading.Lock()


def replaces(new: TuningRecord, old: TuningRecord | None) -> bool:
    """Whether ``new`` replaces ``old``. Workers sharing one optuna study each write the decision
    they drew from it; the one drawn from more trials wins (the last worker to finish saw them all),
    so the final record is the same whichever worker found the best trial."""
    if old is None or not old.current:
        return True
    if new.trials != old.trials:
        return new.trials > old.trials
    return new.best_us <= old.best_us


class MemoryTuningDB(TuningDB):
    def __init__(self):
        self._data: dict[str, dict[str, TuningRecord]] = {}

    def _claim_scope(self) -> object:
        return id(self)  # (searchers sharing this object share its records; others do not see them)

    def put_many(self, device_key, records):
        recs = self._data.setdefault(device_key, {})
        for k, r in records.items():
            if replaces(r, recs.get(k)):
                recs[k] = r

    def _records(self):
        return self._data


class StagedTuningDB(TuningDB):
    """Records held back until they are checked: reads see ``base`` and this run's records, writes wait in
    memory until ``commit`` (``tflgpu tune`` stores a model's records only once the model, timed end to end,
    is not slower with them)."""

    def __init__(self, base: TuningDB):
        self.base, self.staged = base, MemoryTuningDB()

    def get(self, device_key, kernel_key):
        return self.staged.get(device_key, kernel_key) or self.base.get(device_key, kernel_key)

    def put_many(self, device_key, records):
        self.staged.put_many(device_key, records)

    def _records(self):
        merged = {dev: dict(recs) for dev, recs in self.base._records().items()}
        for dev, recs in self.staged._records().items():
            merged.setdefault(dev, {}).update(recs)
        return merged

    def _claim_shared(self, device_key, kernel_key):
        return self.base._claim_shared(device_key, kernel_key)

    def _claim_scope(self):
        return self.base._claim_scope()

    def pending(self) -> list[tuple[str, str, TuningRecord]]:
        """(device_key, kernel_key, record) of every record not yet committed."""
        return [(dev, k, r) for dev, recs in self.staged._records().items() for k, r in recs.items()]

    def commit(self, heuristic_only: bool = False) -> None:
        """Write the held records to ``base``; ``heuristic_only``: each as "the heuristic default" (the search
        is remembered, so it is not repeated, but its parameters are not used)."""
        for dev, recs in self.staged._records().items():
            if heuristic_only:
                recs = {k: replace(r, params={}, best_us=r.default_us) for k, r in recs.items()}
            self.base.put_many(dev, recs)
        self.staged = MemoryTuningDB()


class FileTuningDB(TuningDB):
    """Records in one JSON file, read-modify-written under a file lock with an atomic replace.

    A file that cannot be parsed is moved aside (``.corrupt``), logged, and treated as empty,
    so a damaged file never stops a model from running and is never silently overwritten.
    """

    def __init__(self, path: str | os.PathLike, lock_timeout_s: float = 30.0):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self._cache: tuple[float, int, dict] | None = None  # (mtime, size, records)

    def _lock(self):


        private_dir(self.path.parent)
        return FileLock(str(self.path) + ".lock", timeout=self.lock_timeout_s, mode=0o600)

    def _load(self) -> dict[str, dict[str, TuningRecord]]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return {}
        if self._cache and self._cache[:2] == (st.st_mtime, st.st_size):
            return self._cache[2]
        try:
            doc = json.loads(self.path.read_bytes())
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            data = {dev: {k: TuningRecord.from_json(r) for k, r in recs.items()}
                    for dev, recs in doc["records"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            aside = self.path.with_suffix(self.path.suffix + ".corrupt")
            log.warning("tuning records %s are unreadable (%s); moved to %s, starting empty", self.path, e, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return {}
        self._cache = (st.st_mtime, st.st_size, data)
        return data

    def _records(self):
        return self._load()

    def put_many(self, device_key, records):

        with self._lock():
            self._cache = None
            data = self._load()
            recs = data.setdefault(device_key, {})
            for k, r in records.items():
                if replaces(r, recs.get(k)):
                    recs[k] = r
            doc = {"format": FORMAT, "records": {dev: {k: r.to_json() for k, r in rs.items()}
                                                for dev, rs in data.items()}}
            atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
            self._cache = None


class CacheTuningDB(TuningDB):
    """Records as checked entries of a ``tflgpu.cache.CacheStore`` (one file per device and kernel):
    a damaged record is logged, dropped and re-tuned, never trusted."""

    def __init__(self, store):
        self.store = store
        self.unstored = MemoryTuningDB()  # records a read-only cache cannot take: this process's alone

    def get(self, device_key, kernel_key):
        held = self.unstored.get(device_key, kernel_key)
        if held is not None:
            return held
        payload = self.store.get("tuning", kernel_key, device_key)
        if payload is None:
            return None
        try:
            rec = decode_tuning(payload)
        except InvalidEntry as e:
            self.store.discard(self.store.path("tuning", kernel_key, device_key), str(e))
            return None
        return rec if rec.current else None

    @contextmanager
    def _claim_shared(self, device_key, kernel_key):
        """A lock file per kernel in the cache directory: processes sharing the cache never search one kernel
        at once (the lock dies with its process). A read-only cache has none: the in-process claim is all."""
        if self.store.read_only:
            yield True
            return
        name = xxhash.xxh64_hexdigest(f"{device_key}|{kernel_key}".encode())
        lock = FileLock(str(private_dir(self.store.root / "claims") / f"{name}.lock"), timeout=0, mode=0o600)
        try:
            lock.acquire()
        except Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    def put_many(self, device_key, records):
        if self.store.read_only:
            self.unstored.put_many(device_key, records)
            return
        with FileLock(str(self.store.root / ".tuning.lock"), timeout=30, mode=0o600):  # read-compare-write per key
            for k, r in records.items():
                if replaces(r, self.get(device_key, k)):
                    self.store.put("tuning", k, device_key, encode_tuning(r))

    def _records(self):
        out: dict[str, dict[str, TuningRecord]] = {}
        for e in self.store.entries(kinds=("tuning",), payloads=("tuning",)):
            if e.problem is None:
                try:
                    out.setdefault(e.device_key, {})[e.key] = decode_tuning(e.payload)
                except InvalidEntry:
                    continue
        for dev, recs in self.unstored._records().items():
            out.setdefault(dev, {}).update(recs)
        return out


def default_tuning_db() -> TuningDB:
    """The records in the default cache directory ($TFLGPU_CACHE_DIR or the user cache dir)."""

    return CacheTuningDB(CacheStore())
