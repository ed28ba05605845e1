"""Tuning records across devices: export a device's records to a file, import a file's records (any device's)
into the cache, and find, for a kernel this device has no record of, the record of the nearest device that has
one — the fallback chain a kernel's parameters come from before any search:

1. this device (platform, device, driver and OpenCL C version all equal): its own record;
2. a record of the kernel's own shape and family (op and precision): this device's, of any model's kernel, else a
   shipped one (``tflgpu/data/tuning/*.json``, files in the export format, of any generator version) from the
   nearest device of this platform by links 1, 4 and 5;
3. this device's record of the nearest kernel of the same family (the nearest shapes, by
   ``tuner.shape_distance``), from any model: tuning transfer;
4. the same device under another driver;
5. another device of the same OpenCL platform (the vendor's runtime) and device type, one of the same chip maker
   first (``device_maker``: the Intel CPU runtime runs on Intel's and AMD's CPUs alike);
6. the shipped records of this kernel, by links 1, 4 and 5 and then by device type alone;
7. a shipped record of the same family at the nearest shape (a per-device table of the best knobs by kernel
   family and shape class), from the nearest device by links 1, 4, 5 and device type; of any generator
   version, since a shipped file outlives generator changes: its knobs are a start;
8. the generators' heuristics.

Every link takes only a record whose point the kernel takes (``tuner.KernelTraits.takes``: its knobs the space's, the
generator generating the kernel with it; a knob added since the record was measured takes the kernel's default), so
a record of another kind of kernel of the op, or of a shape or device whose limits the point does not suit, gives
way to the next nearest; a record of another shape lends only a point whose values the kernel's space lists, and
between records of one shape the one of fewer unlisted values wins (``KernelTraits.unlisted``).

By links 3 and 7 (another shape) a composite's choice to launch fused comes along only where the channel counts
are the kernel's own (``lent``).

A kernel's identity (``kernel_key``) holds its code, launch sizes, precision and generator version, not the
device, so a record of one device names the same kernel on another; whether its parameters suit the other device
is what the chain's order guesses, and a search (background or ``tflgpu tune``) then starts from them.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import groupby
from pathlib import Path

from ..cache.records import TuningRecord, device_key, device_maker, split_device_key
from ..cache.store import CacheStore
from .records import CacheTuningDB, TuningDB, replaces
from .tuner import KernelTraits, kernel_channels, shape_distance

log = logging.getLogger("tflgpu")

FORMAT = "tflgpu-tuning-records"
FORMAT_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "tuning"
# (NearestRecords._rank's, nearest first)
LEVELS = ("this device", "same device, other driver", "same platform, same maker", "same platform")
ORDER = (*LEVELS, "same device type")  # (the shipped family table's ranks)


@dataclass
class DeviceRecords:
    """One device's records in an exchange file: the device as ``DeviceIdentity.as_dict()`` gives it."""

    identity: dict
    records: dict[str, TuningRecord] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return device_key(self.identity)


def write_records(path: str | Path, devices: list[DeviceRecords]) -> None:
    doc = {"format": FORMAT, "version": FORMAT_VERSION,
           "devices": [{"identity": d.identity, "records": {k: r.to_json() for k, r in sorted(d.records.items())}}
                       for d in devices]}
    Path(path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def read_records(path: str | Path) -> list[DeviceRecords]:
    """An exchange file's devices and records; a ValueError naming the file and what is wrong otherwise."""
    path = Path(path)
    try:
        doc = json.loads(path.read_bytes())
    except OSError as e:
        raise ValueError(f"cannot read tuning records from {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{path} is not a tuning-records file (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tuning-records file (its format is not {FORMAT!r}; `tflgpu tune MODEL "
                         "--export FILE` writes one)")
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: tuning-records format version {doc.get('version')!r}, this tflgpu reads "
                         f"version {FORMAT_VERSION}")
    out = []
    try:
        for d in doc["devices"]:
            identity = {k: d["identity"][k] for k in ("platform", "device", "driver_version", "opencl_c_version",
                                                       "device_type")}
            out.append(DeviceRecords(identity, {str(k): TuningRecord.from_json(r) for k, r in d["records"].items()}))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: a device entry is malformed ({type(e).__name__}: {e})") from None
    return out


def cache_records(root: str | Path, identity: dict) -> DeviceRecords:
    """Every record of this device (``identity``) that the cache directory ``root`` holds for the current kernel
    generators: what a run's tuning (a background search in a fresh cache) found there, for an export."""
    return held_records(CacheTuningDB(CacheStore(Path(root))), identity)


def held_records(db: TuningDB, identity: dict) -> DeviceRecords:
    """Every record of this device (``identity``) that ``db`` holds for the current kernel generators, whichever
    models' kernels they are (`tflgpu tune --export FILE` without models)."""
    out = DeviceRecords(dict(identity))
    for dev, key, rec in db.items():
        if dev == out.key and rec.current:
            out.records[key] = rec
    return out


def merge_records(into: list[DeviceRecords], new: Iterable[DeviceRecords]) -> int:
    """Merge ``new``'s records into ``into`` (a shipped file's devices, say), device by device (a device ``into``
    does not hold is added, where it brings a record): a kernel's record replaces the held one as a database put
    would (``records.replaces``: drawn from more trials, else faster); records of another generator version are
    left out, since they name kernels this tflgpu no longer makes. Returns how many records were added or
    replaced."""
    held = {d.key: d for d in into}
    changed = 0
    for d in new:
        fresh = {k: rec for k, rec in d.records.items() if rec.current}
        mine = held.get(d.key)
        if mine is None and fresh:
            mine = held[d.key] = DeviceRecords(dict(d.identity))
            into.append(mine)
        for k, rec in fresh.items():
            if replaces(rec, mine.records.get(k)):
                mine.records[k] = rec
                changed += 1
    return changed


@dataclass
class ImportSummary:
    devices: int = 0
    records: int = 0  # that changed what the cache holds (new kernels, or replacing a held record)
    stale: int = 0  # measured with another generator version: they name kernels this tflgpu no longer makes


def import_records(path: str | Path, db: TuningDB) -> ImportSummary:
    """Merge a file's records into ``db`` under their own devices (a held record is replaced as any put replaces
    it: by one drawn from more trials, else by a faster one)."""
    summary = ImportSummary()
    for d in read_records(path):
        fresh = {k: r for k, r in d.records.items() if r.current}
        summary.devices += 1
        summary.stale += len(d.records) - len(fresh)
        before = {k: _as_json(db.get(d.key, k)) for k in fresh}
        if fresh:
            db.put_many(d.key, fresh)
        summary.records += sum(1 for k in fresh if _as_json(db.get(d.key, k)) != before[k])
    return summary


def device_records(db: TuningDB, identity: dict, kernel_keys: Iterable[str]) -> DeviceRecords:
    """This device's records of these kernels (those it has), for an export."""
    out = DeviceRecords(dict(identity))
    for k in kernel_keys:
        rec = db.get(out.key, k)
        if rec is not None:
            out.records[k] = rec
    return out


@dataclass(frozen=True)
class Found:
    record: TuningRecord
    level: str  # which link of the chain: "this device", "same device, other driver", ...


class NearestRecords:
    """The fallback chain for one device: ``find(kernel_key)`` is the nearest device's record, or None.

    The cache's records of other devices are read once, when the first kernel misses its own."""

    def __init__(self, db: TuningDB | None, identity: dict, shipped_dir: Path | None = None):
        self.db, self.identity, self.shipped_dir = db, identity, shipped_dir or SHIPPED_DIR
        self.maker = device_maker(identity["device"])  # (the "same platform, same maker" level's)
        self._local: dict[str, dict[str, TuningRecord]] | None = None
        self._families: dict[str, list[TuningRecord]] = {}  # this device's records by kernel family
        self._shipped: list[DeviceRecords] | None = None
        self._shipped_by_family: dict[str, list[tuple[int, TuningRecord, str]]] | None = None

    @property
    def key(self) -> str:
        return DeviceRecords(self.identity).key

    def _rank(self, key: str, device_type: str | None) -> str | None:
        platform, device = self.identity["platform"], self.identity["device"]
        p, d = split_device_key(key)
        same_type = device_type is None or device_type == self.identity.get("device_type")
        if key == self.key:
            return "this device"
        if (p, d) == (platform, device):
            return "same device, other driver"
        if p == platform and same_type:
            same_maker = self.maker is not None and self.maker == device_maker(d)
            return "same platform, same maker" if same_maker else "same platform"
        return None

    def find(self, kernel_key: str, traits: KernelTraits | None = None) -> Found | None:
        """The nearest record for a kernel whose point the kernel takes (``traits``, as ``tuner.KernelTraits.of``
        gives them: for transfer from other kernels of its family, and to pass over a point its generator refuses;
        None: this kernel's own key alone, any point)."""
        takes = traits.takes if traits is not None else (lambda params: True)
        if self.db is not None:
            own = self.db.get(self.key, kernel_key)
            if own is not None:
                return Found(own, "this device")
            if self._local is None:
                self._local = {}
                for dev, key, rec in self.db.items():
                    if not rec.current:
                        continue
                    if dev != self.key:
                        self._local.setdefault(dev, {})[key] = rec
                    elif rec.family:
                        self._families.setdefault(rec.family, []).append(rec)
        if self._shipped is None:
            self._shipped = _load_shipped(self.shipped_dir)
        shipped = [(d.key, d.identity.get("device_type"), d.records) for d in self._shipped]
        if traits is not None:  # (a record of the kernel's own shape, this device's or a shipped one of this platform)
            same = self._same_shape(shipped, traits)
            if same is not None:
                return same
        if self.db is not None:
            if traits is not None:
                near = _nearest_shape(((0, r, None) for r in self._families.get(traits.family, ())), traits)
                if near is not None:
                    return _family_found(near)
            hit = self._nearest(((dev, None, recs) for dev, recs in self._local.items()), kernel_key, takes)
            if hit is not None:
                return hit
        hit = self._nearest(iter(shipped), kernel_key, takes, prefix="shipped database, ")
        if hit is not None:
            return hit
        for key, device_type, recs in shipped:  # then: any device of this type
            rec = recs.get(kernel_key)
            if (rec is not None and device_type == self.identity.get("device_type") and rec.current
                    and takes(rec.params)):
                return Found(rec, f"shipped database, same device type ({split_device_key(key)[1]})")
        return self._shipped_family(shipped, traits) if traits is not None else None

    def _by_family(self, shipped) -> dict[str, list[tuple[int, TuningRecord, str]]]:
        """The shipped records by family, each with its device's rank (``LEVELS``, then "same device type") and key."""
        if self._shipped_by_family is None:
            self._shipped_by_family = {}
            for key, device_type, recs in shipped:
                level = self._rank(key, device_type) or (
                    "same device type" if device_type == self.identity.get("device_type") else None)
                for rec in recs.values() if level is not None else ():
                    self._shipped_by_family.setdefault(rec.family, []).append((ORDER.index(level), rec, key))
        return self._shipped_by_family

    def _same_shape(self, shipped, traits: KernelTraits) -> Found | None:
        """A record of the kernel's own shape that the kernel takes: this device's (any model's kernel), else a shipped
        one from the nearest device of this platform (the same device's records of MobileNet v2's kernels, measured
        with an older generator, before a record this device holds of MobileNet v1's at other shapes; the H100's
        U-Net records for an H200's U-Net, before the H200's own of MobileNet's shapes)."""
        mine = [(0, r, None) for r in self._families.get(traits.family, ()) if r.shape == traits.shape]
        theirs = [c for c in self._by_family(shipped).get(traits.family, ())
                  if c[0] < len(LEVELS) and c[1].shape == traits.shape]
        best = _nearest_shape(mine + theirs, traits)  # (at one rank, this device's own records first)
        return _family_found(best) if best is not None else None

    def _shipped_family(self, shipped, traits: KernelTraits) -> Found | None:
        """The shipped record of the kernel's family from the nearest device, at the nearest shape on that device."""
        best = _nearest_shape(self._by_family(shipped).get(traits.family, ()), traits)
        return _family_found(best) if best is not None else None

    def _nearest(self, candidates, kernel_key: str, takes, prefix: str = "") -> Found | None:
        order = LEVELS
        best: tuple[int, Found] | None = None
        for key, device_type, recs in candidates:
            rec = recs.get(kernel_key)
            level = self._rank(key, device_type) if rec is not None and rec.current and takes(rec.params) else None
            if level is None:
                continue
            rank = order.index(level)
            if best is None or rank < best[0]:
                best = (rank, Found(rec, prefix + level + ("" if level == "this device" else
                                                            f" ({split_device_key(key)[1]})")))
        return best[1] if best else None


def lent(rec: TuningRecord, shape: tuple[int, ...]) -> TuningRecord:
    """What a record of the same family at another shape lends a kernel of ``shape``: its knobs, but a composite's
    choice to launch fused (``fused``) only where the channel counts are the kernel's own. Whether fusing pays
    turns on them (the sums a fused kernel makes serially, the slices a group takes: on the H100 MobileNet v1's
    7x7 pair of 512 -> 1,024 channels took the fused point of MobileNet v2's 160 -> 960 by this link and ran it in
    42 us, where its two kernels' records cost 13 us each); the image's size moves it little (DeepLab's 17x17 blocks
    and SSD's 19x19 and 10x10 take MobileNet v2's 14x14 and 7x7 choices). Without it the kernel's own default
    decides."""
    if "fused" not in rec.params or kernel_channels(rec.shape) == kernel_channels(shape):
        return rec
    return replace(rec, params={k: v for k, v in rec.params.items() if k != "fused"})


def _as_json(rec: TuningRecord | None) -> dict | None:
    return None if rec is None else rec.to_json()


def _nearest_shape(candidates: Iterable[tuple[int, TuningRecord, str | None]], traits: KernelTraits
                   ) -> tuple[int, TuningRecord, str | None] | None:
    """Of (rank, record, its device's key) candidates, the one of the lowest rank, then of the nearest shape, then of
    the fewest values the kernel's space does not list (then the first), whose point (as ``lent`` lends it) the
    kernel takes, every value listed where the record's shape is another (``KernelTraits.unlisted``), with its record
    as lent; None where none is."""
    near = []
    for n, (rank, rec, key) in enumerate(candidates):
        d = shape_distance(rec.shape, traits.shape)
        if d < math.inf:
            near.append((rank, d, n, (rank, rec, key)))
    near.sort(key=lambda a: a[:3])
    for (_, d), ties in groupby(near, key=lambda a: a[:2]):  # (one rank and distance: the fewest unlisted)
        lends = []
        for n, (*_, (rank, rec, key)) in enumerate(ties):
            rec = lent(rec, traits.shape)
            lends.append((traits.unlisted(rec.params), n, (rank, rec, key)))
        for unlisted, _, c in sorted(lends, key=lambda a: a[:2]):
            if (d == 0 or unlisted == 0) and traits.takes(c[1].params):
                return c
    return None


def _family_found(best: tuple[int, TuningRecord, str | None]) -> Found:
    """A record of the kernel's family as the chain finds it (``_nearest_shape``'s pick, lent: its device's key None
    where it is this device's own), with the link's words."""
    rank, rec, key = best
    out = "x".join(map(str, rec.shape[-4:]))
    where = "this device" if key is None else f"shipped database, {ORDER[rank]} ({split_device_key(key)[1]})"
    return Found(rec, f"{where}, nearest shape ({out} out)")


def _load_shipped(directory: Path) -> list[DeviceRecords]:
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            out.extend(read_records(path))
        except ValueError as e:  # a broken shipped file costs its records, never the run
            log.warning("tuning database %s skipped: %s", path, e)
    return out
