"""Writes a benchmark's table into the README between markers, with the date, the machine and the command,
so the README's tables come from one run of a script and cannot drift from what it measures.

A section is ``<!-- generated:NAME begin -->`` ... ``<!-- generated:NAME end -->``; everything between
the markers is replaced."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import sys
from pathlib import Path


def _cpu_name() -> str:
    """The host CPU's model name, with its family number and widest vector ISA where /proc/cpuinfo gives them
    (a VM's "AMD EPYC" alone does not say a Zen 4, whose AVX-512 units are 256 bits wide, from a Zen 5)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    except OSError:
        return platform.processor() or platform.machine()
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = set(info.get("flags", "").split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    extra = [f"family {info['cpu family']}"] if "cpu family" in info else []
    extra += [isa] if isa else []
    name = info.get("model name") or platform.processor() or platform.machine()
    return f"{name} ({', '.join(extra)})" if extra else name


def measured_on(opencl: bool = True) -> str:
    """One line: the date, the OpenCL device, the host CPU and its cores, and the versions compared."""
    from importlib.metadata import PackageNotFoundError, version

    from tflgpu.version import __version__

    parts = [f"Measured {datetime.date.today().isoformat()}"]
    if opencl:
        try:
            from tflgpu.runtime.device import choose_device

            ident = choose_device().identity
            parts.append(f"OpenCL device: {ident.device} ({ident.platform}, driver {ident.driver_version})")
        except Exception as e:  # noqa: BLE001 (a table without a device still says so)
            parts.append(f"no OpenCL device ({e})")
    parts.append(f"host CPU: {_cpu_name()}, {os.cpu_count()} logical cores")
    try:
        parts.append(f"LiteRT {version('ai-edge-litert')}")
    except PackageNotFoundError:
        pass
    parts.append(f"tflgpu {__version__}")
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith("TFLGPU_")]
    command = " ".join([*env, "python", *(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]])])
    return "; ".join(parts) + f". Command: `{command}`."


def replace_section(readme: Path, name: str, body: str) -> None:
    """Replace the README's generated section ``name`` with ``body``; a README without its markers is an error."""
    if not readme.is_file():
        raise SystemExit(f"--write-readme: {readme} is not a file")
    text = readme.read_text()
    begin, end = f"<!-- generated:{name} begin -->", f"<!-- generated:{name} end -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{readme} has no section {begin} ... {end}")
    readme.write_text(pattern.sub(lambda _: f"{begin}\n{body.strip()}\n{end}", text))
