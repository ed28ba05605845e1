"""The private ICD vendors directory: system .icd files kept, pip runtimes and unregistered GPU drivers added."""

from __future__ import annotations

from tflgpu.runtime import icd


def test_vendors_dir_keeps_system_icds_and_adds_an_unregistered_driver(tmp_path, monkeypatch):
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "pocl.icd").write_text("libpocl.so.2\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setattr(icd, "pip_runtime_libraries", lambda: ["/opt/intel/libintelocl.so"])
    monkeypatch.setattr(icd, "driver_libraries", lambda: ["libnvidia-opencl.so.1"])
    contents = icd.vendors_dir_contents()
    assert contents["pocl.icd"] == "libpocl.so.2\n"
    assert "/opt/intel/libintelocl.so\n" in contents.values()
    assert contents["tflgpu-driver-libnvidia-opencl.icd"] == "libnvidia-opencl.so.1\n"


def test_a_registered_driver_is_not_added_twice(tmp_path, monkeypatch):
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setattr(icd, "pip_runtime_libraries", lambda: [])
    monkeypatch.setattr(icd, "driver_libraries", lambda: ["libnvidia-opencl.so.1"])
    assert icd.vendors_dir_contents() == {"nvidia.icd": "libnvidia-opencl.so.1\n"}


def test_driver_probe_reads_the_dynamic_linkers_cache(monkeypatch, tmp_path):
    """The linker's cache lists a driver installed without its .icd; LD_LIBRARY_PATH is looked at too, and
    ldconfig (find_library) is asked only where there is no cache file."""
    import ctypes.util

    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"glibc-ld.so.cache1.1\x00libfoo.so.2\x00/usr/lib/libfoo.so.2\x00libnvidia-opencl.so.1\x00"
                      b"/usr/local/nvidia/lib64/libnvidia-opencl.so.1\x00")
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    assert icd.driver_libraries(str(cache)) == ["libnvidia-opencl.so.1"]
    cache.write_bytes(b"glibc-ld.so.cache1.1\x00libfoo.so.2\x00")
    assert icd.driver_libraries(str(cache)) == []
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libamdocl64.so").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libdir))
    assert icd.driver_libraries(str(cache)) == ["libamdocl64.so"]

    asked = []

    def find(name):
        asked.append(name)
        return "libnvidia-opencl.so.1" if name == "nvidia-opencl" else None

    monkeypatch.setattr(ctypes.util, "find_library", find)
    assert icd.driver_libraries(str(tmp_path / "missing")) == ["libnvidia-opencl.so.1"]
    assert asked == list(icd._DRIVER_LIBRARIES)




def test_pocls_cache_goes_to_a_private_directory_unless_the_process_chose_one(tmp_path, monkeypatch):
    """PoCL writes into its kernel cache as soon as the loader enumerates it: unless POCL_CACHE_DIR is set, it is
    pointed at the per-user private directory beside the vendors dir (not the user's cache directory)."""
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(icd, "vendors_dir_contents", dict)  # (nothing to add to the loader)
    for chosen in (None, str(tmp_path / "mine")):
        monkeypatch.setattr(icd, "_done", False)
        monkeypatch.delenv("TFLGPU_NO_ICD_SETUP", raising=False)
        if chosen is None:
            monkeypatch.delenv("POCL_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("POCL_CACHE_DIR", chosen)
        icd.ensure_icd_vendors()
        got = os.environ["POCL_CACHE_DIR"]
        if chosen is None:
            base = tmp_path / f"tflgpu-{os.getuid()}"
            assert got == str(base / "pocl") and base.is_dir() and (base.stat().st_mode & 0o777) == 0o700
        else:
            assert got == chosen
