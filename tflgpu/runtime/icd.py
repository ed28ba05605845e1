"""Make pip-installed OpenCL runtimes visible to pyopencl's ICD loader, beside the system's.

pyopencl's wheel bundles the ocl-icd loader, which only reads .icd files in
/etc/OpenCL/vendors (or OCL_ICD_VENDORS). The Intel CPU runtime from PyPI
(``intel-opencl-rt``) ships an .icd whose path is bogus, so it is invisible
unless someone points the loader at ``libintelocl.so``. We do that here:
build a private vendors directory holding an .icd for each pip runtime found
plus every .icd the user's loader would have read (a real GPU's), plus one for
a known GPU driver library that is installed without its .icd (seen in
containers that mount NVIDIA's driver), and point
OCL_ICD_VENDORS (and the Khronos loader's OCL_ICD_FILENAMES) at it. This must
happen before the loader's first platform query in the process.

PoCL, where installed, writes a temporary file into its kernel cache (``$XDG_CACHE_HOME/pocl``) as soon as
the loader enumerates it, whatever device the process then uses. Unless the process chose a PoCL cache itself
(``POCL_CACHE_DIR``), it is pointed at a private per-user directory beside the vendors dir, so a tflgpu start
leaves the user's cache directory alone; tflgpu keeps the binaries it builds in its own cache.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import sys
import tempfile
from importlib import metadata
from pathlib import Path

log = logging.getLogger("tflgpu")

SYSTEM_VENDOR_DIR = "/etc/OpenCL/vendors"
_PIP_RUNTIMES = {"intel-opencl-rt": "libintelocl.so"}
# GPU drivers whose OpenCL library is installed but may lack its .icd file (containers that mount
# the driver, e.g. NVIDIA's /usr/local/nvidia, often do): found through the dynamic linker's cache
_DRIVER_LIBRARIES = ("nvidia-opencl", "amdocl64")
_done = False


def pip_runtime_libraries() -> list[str]:
    """Absolute paths of OpenCL runtimes installed from PyPI in this environment."""
    found: list[str] = []
    for dist, lib in _PIP_RUNTIMES.items():
        try:
            files = metadata.files(dist) or []
        except metadata.PackageNotFoundError:
            files = []
        for f in files:
            if Path(str(f)).name == lib:
                p = Path(str(f.locate())).resolve()
                if p.exists():
                    found.append(str(p))
                    break
        else:
            for p in glob.glob(os.path.join(sys.prefix, "lib", lib)):
                found.append(os.path.realpath(p))
    return sorted(set(found))


LINKER_CACHE = "/etc/ld.so.cache"


def driver_libraries(linker_cache: str = LINKER_CACHE) -> list[str]:
    """Sonames of known GPU OpenCL drivers the dynamic linker can load (``libnvidia-opencl.so.1``, ...): those
    its cache lists or a directory of LD_LIBRARY_PATH holds. Reading the cache takes microseconds, where
    ``ctypes.util.find_library`` runs ``ldconfig -p`` once per name (25 ms each, on every start); it is the
    fallback where there is no cache file to read."""
    try:
        cache = Path(linker_cache).read_bytes()
    except OSError:
        cache = None
    found = []
    for name in _DRIVER_LIBRARIES:
        lib = None
        if cache is not None:
            m = re.search(rb"\x00(lib" + re.escape(name.encode()) + rb"\.so[0-9.]*)\x00", b"\x00" + cache)
            lib = m.group(1).decode() if m else None
            for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if lib is None else ():
                hits = sorted(glob.glob(os.path.join(d, f"lib{name}.so*"))) if d else []
                if hits:
                    lib = Path(hits[0]).name
                    break
        else:
            from ctypes.util import find_library

            try:
                lib = find_library(name)
            except (OSError, RuntimeError):  # (no ldconfig / gcc to ask)
                lib = None
        if lib:
            found.append(lib)
    return found


def _existing_icds() -> list[Path]:
    """The .icd files the loader would read without us (user's OCL_ICD_VENDORS or the system dir)."""
    src = os.environ.get("OCL_ICD_VENDORS") or SYSTEM_VENDOR_DIR
    p = Path(src)
    if p.is_dir():
        return sorted(p.glob("*.icd"))
    return []


def vendors_dir_contents() -> dict[str, str]:
    """File name -> content of the private vendors directory."""
    contents: dict[str, str] = {}
    seen_libs = set()
    for icd in _existing_icds():
        try:
            lib = icd.read_text().strip()
        except OSError:
            continue
        if lib and lib not in seen_libs:
            contents[icd.name] = lib + "\n"
            seen_libs.add(lib)
    user = os.environ.get("OCL_ICD_VENDORS")
    if user and os.path.isfile(user) and user not in seen_libs:  # a single library named directly
        contents["user.icd"] = user + "\n"
        seen_libs.add(user)
    for i, lib in enumerate(pip_runtime_libraries()):
        if lib not in seen_libs:
            contents[f"tflgpu-pip-{i}-{Path(lib).stem}.icd"] = lib + "\n"
            seen_libs.add(lib)
    registered = {Path(lib).name.split(".so")[0] for lib in seen_libs}
    for lib in driver_libraries():  # an installed GPU driver nobody registered
        if Path(lib).name.split(".so")[0] not in registered:
            contents[f"tflgpu-driver-{Path(lib).name.split('.so')[0]}.icd"] = lib + "\n"
            registered.add(Path(lib).name.split(".so")[0])
    return contents


def ensure_icd_vendors() -> str | None:
    """Point the ICD loader at a vendors dir that includes pip runtimes; returns the dir (or None)."""
    global _done
    if _done:
        return os.environ.get("OCL_ICD_VENDORS")
    _done = True
    if os.environ.get("TFLGPU_NO_ICD_SETUP"):
        return None
    base = Path(tempfile.gettempdir()) / f"tflgpu-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    if "POCL_CACHE_DIR" not in os.environ:
        try:
            base.mkdir(mode=0o700, exist_ok=True)  # (PoCL makes its directory in it, not the parents)
            os.environ["POCL_CACHE_DIR"] = str(base / "pocl")
        except OSError as e:  # (PoCL keeps its default)
            log.debug("no private PoCL cache directory in %s: %s", base, e)
    contents = vendors_dir_contents()
    if not any(name.startswith(("tflgpu-pip-", "tflgpu-driver-")) for name in contents):
        return None  # nothing to add: leave the user's loader configuration alone
    digest = hashlib.sha256(repr(sorted(contents.items())).encode()).hexdigest()[:16]
    target = base / f"icd-{digest}"
    if not target.is_dir():
        base.mkdir(mode=0o700, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=base))
        for name, text in contents.items():
            (tmp / name).write_text(text)
        try:
            os.rename(tmp, target)  # atomic: a concurrent process may have made the same dir
        except OSError:
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    os.environ["OCL_ICD_VENDORS"] = str(target)
    libs = [t.strip() for t in contents.values()]
    os.environ["OCL_ICD_FILENAMES"] = os.pathsep.join(libs)
    log.debug("OpenCL ICD vendors: %s (%s)", target, ", ".join(libs))
    return str(target)
