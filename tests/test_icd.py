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


def test_driver_probe_asks_the_dynamic_linker(monkeypatch):
    import ctypes.util

    asked = []

    def find(name):
        asked.append(name)
        return "libnvidia-opencl.so.1" if name == "nvidia-opencl" else None

    monkeypatch.setattr(ctypes.util, "find_library", find)
    assert icd.driver_libraries() == ["libnvidia-opencl.so.1"]
    assert asked == list(icd._DRIVER_LIBRARIES)
