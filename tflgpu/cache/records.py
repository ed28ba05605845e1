"""A tuning record: the parameters chosen for one kernel identity on one device, and the times measured.

A record is only valid for the version of its kernel's generator it was measured with
(``tflgpu.kernels.base.generator_version``): a changed generator may emit different code for the same parameters.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

from ..kernels.base import generator_version


def device_key(identity: dict) -> str:
    """What records and compiled programs are filed under for a device (``DeviceIdentity.as_dict()``'s fields):
    platform, device, driver and OpenCL C version, ``|``-separated (``split_device_key`` reads it back)."""
    return f"{identity['platform']}|{identity['device']}|{identity['driver_version']}|{identity['opencl_c_version']}"


def split_device_key(key: str) -> tuple[str, str]:
    """(platform, device) of a ``device_key``."""
    platform, device, *_ = key.split("|") + ["", ""]
    return platform, device


# the maker a device's name (CL_DEVICE_NAME) shows, by a word in it: a runtime may run on several makers' chips (the
# Intel CPU runtime on Intel and AMD CPUs, PoCL on any), and a record of the same maker's chip is the nearer guess
_MAKER_WORDS = {"intel": "Intel", "xeon": "Intel", "amd": "AMD", "epyc": "AMD", "ryzen": "AMD",
                "radeon": "AMD", "nvidia": "NVIDIA", "geforce": "NVIDIA", "apple": "Apple", "mali": "Arm",
                "adreno": "Qualcomm", "qualcomm": "Qualcomm"}


def device_maker(device: str) -> str | None:
    """The chip maker a device name shows (``_MAKER_WORDS``), or None where no word of it is known."""
    for word in re.split(r"[^a-z0-9]+", device.lower()):
        maker = _MAKER_WORDS.get(word)
        if maker is not None:
            return maker
    return None


def params_to_json(params: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


def params_from_json(params: dict) -> dict:
    """JSON turns tuples (local sizes) into lists; the generators and the search space use tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}


@dataclass
class TuningRecord:
    params: dict  # the knobs to pass to the generator (empty: the heuristic default is best)
    default_us: float  # the heuristic default's time
    best_us: float  # the chosen parameters' time
    trials: int = 0  # completed trials of the search it came from
    op: str = ""  # op name, for reports
    generator_version: int = 0  # its op's generator's (0: the current one's)
    updated: float = field(default_factory=time.time)
    family: str = ""  # the kernel's family, its op and precision (autotune.tuner.kernel_family): whose records transfer
    shape: tuple[int, ...] = ()  # its tensors' BHWC dims (kernel_shape): how near another kernel of the family is

    def __post_init__(self):
        if not self.generator_version:
            self.generator_version = generator_version(self.op)

    @property
    def speedup(self) -> float:
        return self.default_us / self.best_us if self.best_us > 0 else 1.0

    @property
    def current(self) -> bool:
        """Whether the generator making its kernel now is the one it was measured with (a record of another
        names a kernel this tflgpu may no longer make, or make otherwise from its parameters)."""
        return self.generator_version == generator_version(self.op)

    def to_json(self) -> dict:
        d = asdict(self)
        d["params"] = params_to_json(self.params)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, d: dict) -> TuningRecord:
        fields = {k: d[k] for k in ("params", "default_us", "best_us", "trials", "op", "generator_version",
                                    "updated", "family", "shape") if k in d}
        rec = cls(**fields)
        if not isinstance(rec.params, dict):
            raise ValueError("params is not a mapping")
        rec.params = params_from_json(rec.params)
        rec.shape = tuple(int(v) for v in rec.shape)
        return rec
