"""Tuning records across devices (tflgpu.autotune.exchange): export, import, and the fallback chain a kernel
without a record of this device takes its parameters from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.autotune import MemoryTuningDB, TuningRecord, kernel_key
from tflgpu.autotune.exchange import (
    DeviceRecords,
    NearestRecords,
    cache_records,
    import_records,
    merge_records,
    read_records,
    write_records,
)
from tflgpu.cache.records import device_maker
from tflgpu.kernels.program import shared_base

from .conftest import REPO, assert_close, litert, run_model
from .oputil import conv_model

THIS = {"platform": "Intel(R) OpenCL", "device": "AMD EPYC", "driver_version": "2026.1", "opencl_c_version": "3.0",
        "device_type": "CPU"}


def _rec(params: dict, speedup: float = 2.0) -> TuningRecord:
    return TuningRecord(params, 10.0 * speedup, 10.0, 5, "CONV_2D")


def _device(**changes) -> dict:
    return {**THIS, **changes}


def test_chain_prefers_the_nearest_device(tmp_path):
    db = MemoryTuningDB()
    near = NearestRecords(db, THIS, shipped_dir=tmp_path)
    assert near.find("k") is None  # nothing anywhere: the heuristics
    shipped = [DeviceRecords(_device(platform="Other CL", device="Other CPU"), {"k": _rec({"tile_x": 1})})]
    write_records(tmp_path / "cpus.json", shipped)
    assert NearestRecords(db, THIS, shipped_dir=tmp_path).find("k").level == \
        "shipped database, same device type (Other CPU)"
    db.put(DeviceRecords(_device(device="Xeon")).key, "k", _rec({"tile_x": 2}))
    assert NearestRecords(db, THIS, shipped_dir=tmp_path).find("k").level == "same platform (Xeon)"
    # (a chip of this device's maker before another's, under one runtime)
    db.put(DeviceRecords(_device(device="AMD Ryzen 9 7950X")).key, "k", _rec({"tile_x": 3}))
    found = NearestRecords(db, THIS, shipped_dir=tmp_path).find("k")
    assert found.level == "same platform, same maker (AMD Ryzen 9 7950X)" and found.record.params == {"tile_x": 3}
    db.put(DeviceRecords(_device(driver_version="2025.9")).key, "k", _rec({"tile_x": 4}))
    found = NearestRecords(db, THIS, shipped_dir=tmp_path).find("k")
    assert found.level == "same device, other driver (AMD EPYC)" and found.record.params == {"tile_x": 4}
    db.put(DeviceRecords(THIS).key, "k", _rec({"tile_x": 8}))
    found = NearestRecords(db, THIS, shipped_dir=tmp_path).find("k")
    assert found.level == "this device" and found.record.params == {"tile_x": 8}
    # another platform's record is no guide for this one, nor a shipped one of another device type
    other = NearestRecords(MemoryTuningDB(), _device(platform="NVIDIA CUDA", device_type="GPU"), shipped_dir=tmp_path)
    assert other.find("k") is None


@pytest.mark.parametrize("name,maker", [
    ("Intel(R) Xeon(R) Processor", "Intel"), ("Intel(R) Core(TM) i7-1185G7 @ 3.00GHz", "Intel"),
    ("AMD EPYC 9R14 96-Core Processor", "AMD"), ("AMD Ryzen 9 7950X", "AMD"), ("gfx1100", None),
    ("NVIDIA H100 80GB HBM3", "NVIDIA"), ("Mali-G78", "Arm"), ("QUALCOMM Adreno(TM) 740", "Qualcomm"),
    ("cpu-haswell-Intel(R) Xeon(R) CPU E5-2680 v3", "Intel"), ("pthread-AMD EPYC 7B13", "AMD")])
def test_a_device_names_its_maker(name, maker):
    """CL_DEVICE_NAME as runtimes give it (PoCL's with its own prefix): the maker the chain's level reads."""
    assert device_maker(name) == maker


def test_records_keep_family_and_shape_in_the_cache_and_in_files():
    from tflgpu.cache.plans import decode_tuning, encode_tuning

    rec = replace(_rec({"tile_x": 2}), family="f", shape=(1, 8, 8, 4, 1, 8, 8, 16))
    for back in (decode_tuning(encode_tuning(rec)), TuningRecord.from_json(json.loads(json.dumps(rec.to_json())))):
        assert (back.family, back.shape, back.params) == (rec.family, rec.shape, rec.params)
    old = decode_tuning(encode_tuning(_rec({})))  # a record from before: no family, so it transfers nowhere
    assert (old.family, old.shape) == ("", ())


def test_export_import_roundtrip_and_stale_records(tmp_path):
    stale = replace(_rec({"tile_x": 2}), generator_version=1)
    path = tmp_path / "records.json"
    write_records(path, [DeviceRecords(THIS, {"a": _rec({"tile_x": 4}), "b": stale})])
    (dev,) = read_records(path)
    assert dev.identity == THIS and dev.records["a"].params == {"tile_x": 4}
    db = MemoryTuningDB()
    got = import_records(path, db)
    assert (got.devices, got.records, got.stale) == (1, 1, 1)
    assert db.get(DeviceRecords(THIS).key, "a").params == {"tile_x": 4}
    assert import_records(path, db).records == 0  # nothing better to store the second time


@pytest.mark.parametrize("content,why", [
    (b"not json", "not JSON"),
    (json.dumps({"format": "something else"}).encode(), "its format is not"),
    (json.dumps({"format": "tflgpu-tuning-records", "version": 99}).encode(), "format version 99"),
    (json.dumps({"format": "tflgpu-tuning-records", "version": 1, "devices": [{"identity": {}}]}).encode(),
     "a device entry is malformed"),
])
def test_bad_files_are_refused_by_name(tmp_path, content, why):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{path}.*{why}|{why}.*"):
        read_records(path)


def test_merging_records_keeps_the_better_of_two_and_adds_what_is_new():
    """A shipped file's records merged with an export's: a record drawn from more trials replaces the held one,
    a slower one from as many trials does not, a new kernel and a new device are added, and a record of another
    generator version is left out (it names a kernel this tflgpu does not make), a device with nothing else too."""
    a, b, new, theirs = _rec({"tile_x": 1}), _rec({"tile_x": 2}), _rec({}), _rec({"tile_x": 2})
    held = [DeviceRecords(THIS, {"a": a, "b": b})]
    more_trials = replace(_rec({"tile_x": 4}, speedup=1.1), trials=9)
    slower = replace(_rec({"tile_x": 8}), best_us=11.0)
    stale = replace(_rec({"tile_x": 16}), generator_version=1)
    other = _device(device="Xeon")
    changed = merge_records(held, [DeviceRecords(THIS, {"a": more_trials, "b": slower, "c": new, "d": stale}),
                                   DeviceRecords(other, {"a": theirs}),
                                   DeviceRecords(_device(device="stale only"), {"a": stale})])
    assert changed == 3 and [d.identity for d in held] == [THIS, other]
    assert held[0].records == {"a": more_trials, "b": b, "c": new} and held[1].records == {"a": theirs}


def test_a_runs_search_exported_from_its_cache_is_where_a_fresh_start_begins(opencl_device, rng, tmp_path,
                                                                             monkeypatch):
    """What a search left in a cache directory (bench_gpu.py --export-background's source) exported, folded into
    a shipped database file by bench/merge_records.py, is the start of a fresh plan on this device (no cache, no
    search: ``tuning="none"``), reported as the shipped database's record of this device; the plan matches
    LiteRT. A file that is not a records file is refused by name and the database is left as it was."""
    from tflgpu.autotune import exchange

    model, feeds = _conv(rng, 13)
    (tmp_path / "none").mkdir()
    monkeypatch.setattr(exchange, "SHIPPED_DIR", tmp_path / "none")  # (the search starts from the heuristics)
    searched = Interpreter(model_content=model, delegate=GpuDelegate(serialization_dir=tmp_path / "cache",
                                                                     tuning="fast", tuning_trials=3))
    (tuned,) = searched.gpu_plan.tuning_results
    found = cache_records(tmp_path / "cache", opencl_device.identity.as_dict())
    assert list(found.records) == [tuned.key] and found.records[tuned.key].params == tuned.params
    write_records(tmp_path / "run.json", [found])
    shipped = tmp_path / "shipped" / "this-device.json"
    shipped.parent.mkdir()
    write_records(shipped, [])

    def merge(*files):
        return subprocess.run([sys.executable, "bench/merge_records.py", str(shipped), *map(str, files)], cwd=REPO,
                              capture_output=True, text=True, timeout=120, check=False)

    r = merge(tmp_path / "run.json")
    assert r.returncode == 0 and "1 records added or replaced (0 -> 1 records, 1 devices)" in r.stdout, r.stderr
    (tmp_path / "bad.json").write_text("{}")
    kept = shipped.read_bytes()
    r = merge(tmp_path / "bad.json")
    assert r.returncode == 1 and "bad.json is not a tuning-records file" in r.stderr and shipped.read_bytes() == kept
    monkeypatch.setattr(exchange, "SHIPPED_DIR", shipped.parent)
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=MemoryTuningDB(),
                                                               cache=False))
    (tk,) = it.gpu_plan.tuning_results
    assert tk.source.startswith("database: shipped database, this device") and tk.params == tuned.params
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0])


def test_a_plan_starts_from_the_nearest_devices_record(opencl_device, rng, tmp_path):
    """A record imported from this device under another driver is what a fresh start runs (no search with
    tuning "none"), reported as such, and the output still matches LiteRT."""
    model, feeds = conv_model(rng)
    step = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=False)).gpu_plan.steps[0]
    key = kernel_key(step.op.name, step.specs, False, shared_base(step.specs))
    params = {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"}
    identity = {**opencl_device.identity.as_dict(), "driver_version": "an older driver"}
    path = tmp_path / "other_driver.json"
    write_records(path, [DeviceRecords(identity, {key: _rec(params)})])
    db = MemoryTuningDB()
    import_records(path, db)
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=db, cache=False))
    (tk,) = it.gpu_plan.tuning_results
    assert tk.source.startswith("database: same device, other driver") and tk.params == params
    assert it.gpu_plan.steps[0].params == params
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0])


def test_a_search_that_keeps_the_nearest_start_records_it(opencl_device, rng, tmp_path, monkeypatch):
    """A kernel that started from another driver's record and whose search finds nothing faster (every candidate
    costs the same here) keeps that record's parameters, and this device's record says so: a later plan without a
    stored plan (another model with the kernel) runs them too, not the heuristics ({} would name those)."""
    from tflgpu.autotune.measure import KernelBench

    launch = KernelBench._launch

    def same_cost(self, launches):
        launch(self, launches)
        return 100.0

    monkeypatch.setattr(KernelBench, "_launch", same_cost)
    model, feeds = conv_model(rng)
    step = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=False)).gpu_plan.steps[0]
    key = kernel_key(step.op.name, step.specs, False, shared_base(step.specs))
    params = {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"}
    path = tmp_path / "other_driver.json"
    write_records(path, [DeviceRecords({**opencl_device.identity.as_dict(), "driver_version": "an older driver"},
                                       {key: _rec(params)})])
    db = MemoryTuningDB()
    import_records(path, db)
    searched = Interpreter(model_content=model, delegate=GpuDelegate(tuning="fast", tuning_db=db, cache=False,
                                                                     tuning_trials=3))
    assert searched.gpu_plan.steps[0].params == params
    assert db.get(opencl_device.identity.key(), key).params == params
    later = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=db, cache=False))
    (tk,) = later.gpu_plan.tuning_results
    assert tk.source == "record" and later.gpu_plan.steps[0].params == params
    assert_close(run_model(lambda **kw: later, model, feeds)[0], run_model(litert(), model, feeds)[0])


def test_cli_export_then_import_into_another_cache(opencl_device, tmp_path):
    from tflgpu.model.default_model import DEFAULT_MODEL_PATH

    export = tmp_path / "out" / "records.json"

    def tflgpu(*args, cache):
        env = {**os.environ, "TFLGPU_CACHE_DIR": str(tmp_path / cache)}
        return subprocess.run([sys.executable, "-m", "tflgpu.cli", *args], capture_output=True, text=True,
                              cwd=REPO, env=env, timeout=600, check=False)

    r = tflgpu("tune", str(DEFAULT_MODEL_PATH), "--mode", "fast", "--trials", "2", "--repeat", "3", "-q",
               "--export", str(export), cache="a")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exported" in r.stdout and export.is_file()
    (dev,) = read_records(export)
    assert dev.identity["device"] == opencl_device.identity.device and dev.records
    r = tflgpu("tune", "--import", str(export), cache="b")
    assert r.returncode == 0 and f"imported {len(dev.records)} records of 1 device(s)" in r.stdout, r.stdout + r.stderr
    r = tflgpu("cache", "ls", cache="b")
    assert f"{len(dev.records)} tuning records" in r.stdout
    r = tflgpu("tune", "--import", str(tmp_path / "missing.json"), cache="b")
    assert r.returncode != 0 and "--import" in r.stderr and "no such file" in r.stderr
    # without models: every record the cache holds of this device (here the imported ones), nothing tuned
    again = tmp_path / "again.json"
    r = tflgpu("tune", "--export", str(again), cache="b")
    assert r.returncode == 0 and f"exported {len(dev.records)} records" in r.stdout, r.stdout + r.stderr
    assert "nothing tuned" in r.stdout and "tuning mode" not in r.stderr
    (held,) = read_records(again)
    assert held.identity == dev.identity and {k: r.to_json() for k, r in held.records.items()} == {
        k: r.to_json() for k, r in dev.records.items()}
    r = tflgpu("tune", "--export", str(again), cache="c")
    assert r.returncode == 0 and "exported 0 records" in r.stdout and not read_records(again)[0].records
    r = tflgpu("tune", cache="b")
    assert r.returncode == 2 and "tune needs MODEL files" in r.stderr


def _conv(rng, hw: int, cin: int = 8):
    from .oputil import In, op_model, rand

    return op_model("CONV_2D", [In(rand(rng, (1, hw, hw, cin))), rand(rng, (16, 3, 3, cin)), rand(rng, (16,))],
                    padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")


def test_a_new_kernel_starts_from_its_nearest_tuned_neighbour(opencl_device, rng):
    """Tuning transfer: a conv of a shape never tuned takes the record of the nearest tuned conv of its family on
    this device (another model's), and still matches LiteRT; among two records, the nearer shape's."""
    from tflgpu.autotune.tuner import kernel_family, kernel_shape
    from tflgpu.ops.layout import bhwc

    db = MemoryTuningDB()
    tuned, _ = _conv(rng, 12)
    it = Interpreter(model_content=tuned, delegate=GpuDelegate(tuning="fast", tuning_db=db, tuning_budget_s=20,
                                                               cache=False))
    (first,) = it.gpu_plan.tuning_results
    assert first.source == "tuned"
    held = db.get(opencl_device.identity.key(), first.key)
    assert held.family and len(held.shape) == 8  # input and output BHWC

    model, feeds = _conv(rng, 20)
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=db, cache=False))
    (tk,) = it.gpu_plan.tuning_results
    assert tk.source.startswith("database: this device, nearest shape") and tk.params == held.params
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0])

    step = it.gpu_plan.steps[0]  # two more records of its family: 16x16 (nearer than 12x12) wins
    layouts = {t: bhwc(it.gpu_plan.sg.tensors[t].shape) for t in step.specs[0].inputs + step.specs[0].outputs}
    family, shape = kernel_family("CONV_2D", False), kernel_shape(step.specs, layouts)
    assert family == held.family == "CONV_2D fp32"
    near = {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"}
    db.put(opencl_device.identity.key(), "another-kernel", replace(_rec(near), family=family,
                                                                     shape=(1, 16, 16, 8, 1, 16, 16, 16)))
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=db, cache=False))
    assert it.gpu_plan.tuning_results[0].params == near
    assert shape == (1, 20, 20, 8, 1, 20, 20, 16)


def test_a_stored_plan_keeps_its_start_over_a_neighbours_record(opencl_device, rng, tmp_path):
    """A kernel with no record of its own starts from the nearest tuned kernel of its family in a new plan; in a
    stored plan it keeps the parameters stored with it (their program is compiled already: MobileNet v2 built a
    quick program at its first start after `tflgpu warmup` otherwise), and a search decides, as ever."""
    from tflgpu.autotune.records import CacheTuningDB
    from tflgpu.autotune.tuner import kernel_family
    from tflgpu.cache.store import CacheStore

    model, _ = _conv(rng, 20)
    opts = {"serialization_dir": tmp_path, "tuning": "none", "tiered_compile": False}
    first = Interpreter(model_content=model, delegate=GpuDelegate(**opts))
    first.allocate_tensors()
    near = {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"}
    assert first.gpu_plan.steps[0].params != near
    family = kernel_family("CONV_2D", False)
    CacheTuningDB(CacheStore(tmp_path)).put(opencl_device.identity.key(), "another-kernel",
                                            replace(_rec(near), family=family, shape=(1, 16, 16, 8, 1, 16, 16, 16)))
    # a new plan (another token: no stored plan) of the same model takes the neighbour's parameters
    fresh = Interpreter(model_content=model, delegate=GpuDelegate(**opts, model_token="fresh"))
    assert fresh.gpu_plan.steps[0].params == near and fresh.gpu_plan.build_stats["plan"] == "built"
    assert fresh.gpu_plan.program_key() != first.gpu_plan.program_key()
    again = Interpreter(model_content=model, delegate=GpuDelegate(**opts))
    stats = again.gpu_plan.build_stats
    assert stats["plan"] == "cache" and stats["source_builds"] == 0 and stats["binary_loads"] == 1
    assert again.gpu_plan.steps[0].params == first.gpu_plan.steps[0].params
    assert again.gpu_plan.program_key() == first.gpu_plan.program_key()


def test_a_neighbours_choice_to_fuse_is_lent_only_at_its_channel_counts(tmp_path):
    """A composite's ``fused`` travels by the nearest-shape links (this device's records, the shipped family table)
    only to a kernel of the same channel counts (DeepLab's 17x17 block from MobileNet v2's 14x14); to other counts
    (MobileNet v1's 512 -> 1,024 from v2's 160 -> 960) the other knobs go and the kernel's default decides."""
    from tflgpu.autotune.tuner import KernelTraits

    fused = {"fused": True, "rows": 7, "slices": 1, "group": 128}
    v2 = (1, 14, 14, 96, 1, 14, 14, 576)
    space = {"fused": [False, True], "rows": [1, 2, 7], "slices": [1, 2], "group": [64, 128]}
    deeplab, v1 = (KernelTraits("f", (1, 17, 17, 96, 1, 17, 17, 576), space),
                   KernelTraits("f", (1, 14, 14, 512, 1, 14, 14, 1024), space))
    db = MemoryTuningDB()
    db.put(DeviceRecords(THIS).key, "k-v2", replace(_rec(fused), family="f", shape=v2))
    near = NearestRecords(db, THIS, shipped_dir=tmp_path)
    same = near.find("k-deeplab", deeplab)
    assert same.level.startswith("this device, nearest shape") and same.record.params == fused
    other = near.find("k-v1", v1)
    assert other.record.params == {"rows": 7, "slices": 1, "group": 128}
    assert db.get(DeviceRecords(THIS).key, "k-v2").params == fused  # (the record itself is unchanged)
    gpu = _device(platform="NVIDIA CUDA", device="H100", device_type="GPU")
    write_records(tmp_path / "gpus.json", [DeviceRecords(gpu, {"k-v2": replace(_rec(fused), family="f", shape=v2)})])
    shipped = NearestRecords(MemoryTuningDB(), {**gpu, "driver_version": "1"}, shipped_dir=tmp_path)
    assert shipped.find("k-deeplab", deeplab).record.params == fused
    found = shipped.find("k-v1", KernelTraits("f", (1, 7, 7, 512, 1, 7, 7, 1024), space))
    assert "nearest shape" in found.level and "fused" not in found.record.params


def test_a_neighbours_point_is_lent_only_where_the_kernel_takes_it(tmp_path):
    """The family is the op and precision; which of its records start a kernel is the kernel's call. A record of
    another shape lends only a point whose values the kernel's space lists (a wide conv's 4-slice tile is no start
    for a conv of one output channel), never one naming a knob the space lacks or one the generator refuses; of
    records of the kernel's own shape, the one whose values the space lists wins, and the generator may take values
    the space leaves out there (a ``k_chunk`` past the input's slices). A record of the kernel's own shape, this
    device's or a shipped one of another device of this platform, comes before this device's of another shape (an
    H200 starting U-Net from the H100's U-Net records), but not one of another platform."""
    from tflgpu.autotune.tuner import KernelTraits, kernel_family

    family, shape = kernel_family("CONV_2D", False), (1, 12, 13, 8, 1, 12, 13, 1)
    space = {"tile_x": [1, 2, 4], "tile_s": [1], "k_chunk": [4], "lanes": [4, 16]}
    refused: list = []

    def accepts(params):  # (the generator: a 4-slice tile too, as the same code; k_chunk 4 or 8)
        ok = params.get("tile_s", 1) in (1, 4) and params.get("k_chunk", 4) in (4, 8)
        refused.extend([] if ok else [params])
        return ok

    traits = KernelTraits(family, shape, space, accepts)
    at = lambda hw, cout: (1, hw, hw, 8, 1, hw, hw, cout)
    mine = {"wide": replace(_rec({"tile_x": 4, "tile_s": 4}), family=family, shape=at(12, 16)),
            "other kind": replace(_rec({"tile_x": 2, "mem_lanes": True}), family=family, shape=at(12, 2)),
            "listed": replace(_rec({"tile_x": 2, "lanes": 16}), family=family, shape=at(32, 1))}
    db = MemoryTuningDB()
    db.put_many(DeviceRecords(THIS).key, mine)
    found = NearestRecords(db, THIS, shipped_dir=tmp_path).find("k", traits)
    assert found.record.params == {"tile_x": 2, "lanes": 16} and "nearest shape (1x32x32x1 out)" in found.level
    own = {"refused": replace(_rec({"tile_x": 1, "k_chunk": 16}), family=family, shape=shape),
           "another kind": replace(_rec({"tile_x": 1, "mem_lanes": True}), family=family, shape=shape),
           "unlisted": replace(_rec({"tile_x": 1, "k_chunk": 8}), family=family, shape=shape),
           "listed": replace(_rec({"tile_x": 4, "k_chunk": 4}), family=family, shape=shape)}
    db.put_many(DeviceRecords(THIS).key, {k: own[k] for k in ("refused", "another kind", "unlisted")})
    found = NearestRecords(db, THIS, shipped_dir=tmp_path).find("k", traits)
    assert found.record.params == {"tile_x": 1, "k_chunk": 8} and refused == [{"tile_x": 1, "k_chunk": 16}]
    db.put(DeviceRecords(THIS).key, "listed", own["listed"])
    assert NearestRecords(db, THIS, shipped_dir=tmp_path).find("k", traits).record.params == own["listed"].params

    sibling, other = _device(device="AMD EPYC 9B45"), _device(platform="Portable Computing Language")
    write_records(tmp_path / "cpus.json", [
        DeviceRecords(THIS, {"near": replace(_rec({"tile_x": 2}), family=family, shape=at(14, 1))}),
        DeviceRecords(other, {"own shape": replace(_rec({"tile_x": 4}), family=family, shape=shape)})])
    shipped = NearestRecords(MemoryTuningDB(), THIS, shipped_dir=tmp_path)
    assert shipped.find("k", traits).level.startswith("shipped database, this device (AMD EPYC), nearest shape")
    write_records(tmp_path / "sibling.json", [
        DeviceRecords(sibling, {"own shape": replace(_rec({"tile_x": 1}), family=family, shape=shape)})])
    found = NearestRecords(MemoryTuningDB(), THIS, shipped_dir=tmp_path).find("k", traits)
    assert found.level.startswith("shipped database, same platform, same maker (AMD EPYC 9B45)")
    assert found.record.params == {"tile_x": 1}
    # and before this device's own record of another shape (another model's kernel): a shape's record is the start
    held = MemoryTuningDB()
    held.put(DeviceRecords(THIS).key, "listed", mine["listed"])
    found = NearestRecords(held, THIS, shipped_dir=tmp_path).find("k", traits)
    assert found.record.params == {"tile_x": 1} and "AMD EPYC 9B45" in found.level
    held.put(DeviceRecords(THIS).key, "own shape", replace(_rec({"tile_x": 2}), family=family, shape=shape))
    found = NearestRecords(held, THIS, shipped_dir=tmp_path).find("k", traits)
    assert found.record.params == {"tile_x": 2} and found.level == "this device, nearest shape (1x12x13x1 out)"


def test_a_neighbours_work_group_size_that_does_not_divide_the_grid_is_fitted(opencl_device, rng):
    """A transferred record's work-group size need not divide this kernel's grid (OpenCL 1.2 refuses such a
    launch: INVALID_WORK_GROUP_SIZE at invoke, found by bench_tuning's transfer column): the record applies whole,
    the kernel launching the largest group within it that divides its grid (kernels.knobs.fitted)."""
    from tflgpu.autotune.tuner import kernel_family, kernel_shape
    from tflgpu.ops.layout import bhwc

    model, feeds = _conv(rng, 13)
    plain = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=False, cache=False)).gpu_plan
    step = plain.steps[0]
    spec = step.specs[0]
    uneven = next(ls for ls in spec.space["local_size"] if ls and any(g % w for g, w in zip(spec.global_size, ls)))
    layouts = {t: bhwc(plain.sg.tensors[t].shape) for t in spec.inputs + spec.outputs}
    params = {**{k: v for k, v in spec.params.items() if k in spec.space}, "local_size": uneven}  # (a search's point)
    db = MemoryTuningDB()
    db.put(opencl_device.identity.key(), "a-neighbour", replace(
        _rec(params), family=kernel_family("CONV_2D", False), shape=kernel_shape(step.specs, layouts)))
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=db, cache=False))
    got = it.gpu_plan.steps[0]
    assert got.params == params and got.specs[0].local_size != uneven
    assert all(g % w == 0 and w <= u for g, w, u in zip(got.specs[0].global_size, got.specs[0].local_size, uneven))
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0])


def test_a_shipped_record_of_the_family_is_the_start_where_nothing_nearer_is(opencl_device, rng, tmp_path,
                                                                            monkeypatch):
    """The shipped database's last link: a kernel no device has a record of starts from the shipped record of its
    family at the nearest shape, from the nearest device (here another CPU: same device type), measured with
    another generator version (a shipped file outlives generator changes); the plan matches LiteRT. A family the
    database does not hold keeps the heuristics."""
    from tflgpu.autotune import exchange
    from tflgpu.autotune.tuner import kernel_family, kernel_shape
    from tflgpu.ops.layout import bhwc

    model, feeds = _conv(rng, 13)
    plain = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=False, cache=False)).gpu_plan
    step = plain.steps[0]
    layouts = {t: bhwc(plain.sg.tensors[t].shape) for t in step.specs[0].inputs + step.specs[0].outputs}
    family, shape = kernel_family("CONV_2D", False), kernel_shape(step.specs, layouts)
    far, near = ({"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"},
                 {"tile_x": 2, "tile_s": 2, "lanes": 4, "vec_hint": "float4", "strided": True})
    other_cpu = {**opencl_device.identity.as_dict(), "platform": "Other CL", "device": "Other CPU"}
    records = {"k-far": replace(_rec(far), family=family, shape=(1, 56, 56, 8, 1, 56, 56, 16), generator_version=1),
               "k-near": replace(_rec(near), family=family, shape=(1, 14, 14, 8, 1, 14, 14, 16), generator_version=1),
               "k-other-family": replace(_rec({"tile_x": 8}), family="another", shape=shape)}
    write_records(tmp_path / "cpus.json", [DeviceRecords(other_cpu, records)])
    monkeypatch.setattr(exchange, "SHIPPED_DIR", tmp_path)
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=MemoryTuningDB(),
                                                               cache=False))
    (tk,) = it.gpu_plan.tuning_results
    assert tk.source == "database: shipped database, same device type (Other CPU), nearest shape (1x14x14x16 out)"
    assert it.gpu_plan.steps[0].params == {**step.params, **near}
    assert_close(run_model(lambda **kw: it, model, feeds)[0], run_model(litert(), model, feeds)[0])
    # without a cache the shipped database still starts the plan (package data: nothing read from or written to a
    # cache directory); only tuning_db=False leaves it out
    bare = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", cache=False)).gpu_plan
    assert [t.source for t in bare.tuning_results] == [tk.source] and bare.steps[0].params == {**step.params, **near}
    assert not plain.tuning_results
    write_records(tmp_path / "cpus.json", [DeviceRecords(other_cpu, {"k-other-family": records["k-other-family"]})])
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="none", tuning_db=MemoryTuningDB(),
                                                               cache=False))
    assert not it.gpu_plan.tuning_results and it.gpu_plan.steps[0].params == step.params


def test_a_stored_plan_started_from_the_database_is_still_searched(opencl_device, rng, tmp_path, monkeypatch):
    """A plan stored with a kernel's parameters from the fallback chain (a start, not a decision of this device)
    runs them at its next start, and a background search still takes that kernel up: the stored plan's
    parameters are not the caller's explicit ones. Once searched, the next start finds its record and searches
    nothing."""
    from tflgpu.autotune import exchange

    model, feeds = conv_model(rng)
    step = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=False, cache=False)).gpu_plan.steps[0]
    key = kernel_key(step.op.name, step.specs, False, shared_base(step.specs))
    params = {**step.params, "tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"}
    shipped, cache = tmp_path / "shipped", tmp_path / "cache"
    shipped.mkdir()
    write_records(shipped / "this.json", [DeviceRecords(opencl_device.identity.as_dict(), {key: _rec(params)})])
    monkeypatch.setattr(exchange, "SHIPPED_DIR", shipped)
    # (a first start that searches nothing: a background budget of 0)
    first = Interpreter(model_content=model, delegate=GpuDelegate(tuning="background", serialization_dir=cache,
                                                                  tuning_budget_s=0))
    assert first.gpu_plan.tuning_results[0].source.startswith("database: shipped database, this device")
    first.wait_background(60)
    del first
    again = Interpreter(model_content=model, delegate=GpuDelegate(tuning="background", serialization_dir=cache,
                                                                  tuning_budget_s=10))
    assert again.gpu_plan.build_stats["plan"] == "cache" and again.gpu_plan.steps[0].params == params
    assert again.tuning_status() is not None and again.wait_background(300)
    status = again.tuning_status()
    assert status.kernels_done == status.kernels_searched == 1 and not status.last_error
    assert_close(run_model(lambda **kw: again, model, feeds)[0], run_model(litert(), model, feeds)[0])


# each shipped device's target as Target.of reads it there
NVIDIA = {"float_lanes": 1, "gpu": True, "images": True, "max_group": 1024, "units": 132}  # (NVIDIA's OpenCL 1.2)
INTEL_CPU = {"float_lanes": 16, "subgroups": "cl_intel_subgroups", "images": True, "max_group": 1024}


@pytest.mark.parametrize("name,target,models", [
    ("nvidia-h100.json", NVIDIA, ("mobilenet_v1_1.0_224.tflite", "mobilenet_v2_1.0_224.tflite",
                                  "unet_small_256.tflite")),
    ("nvidia-h200.json", NVIDIA, ("mobilenet_v2_1.0_224.tflite",)),
    ("intel-opencl-cpu-amd-epyc-zen5.json", {**INTEL_CPU, "units": 2}, ("mobilenet_v2_1.0_224.tflite",)),
    ("intel-opencl-cpu-xeon-sapphire-rapids.json", {**INTEL_CPU, "units": 2},
     ("mobilenet_v1_1.0_224.tflite", "mobilenet_v2_1.0_224.tflite", "unet_small_256.tflite")),
    ("pocl-cpu-amd-epyc.json", {"float_lanes": 16, "images": True, "max_group": 1024, "units": 2},
     ("mobilenet_v2_1.0_224.tflite",))])
def test_a_shipped_file_still_starts_the_kernels_it_was_measured_on(opencl_device, tmp_path, name, target, models):
    """A device's shipped records outlive the generator version they were measured with, so they start its kernels
    through their family at the nearest shape, where the kernel's generator takes the record's point. With that
    device's target and identity (the plans selected for it, nothing compiled), every tunable kernel of the models
    the file was measured on whose family it holds starts from that file's records, at the kernel's own shape where
    the file holds a record of it that its generator takes; few of those are refused. A family named by the
    search space's lists failed this unseen: knobs and values added since left the H100's and H200's records of
    U-Net's transposed convs and of deep convs of DeepLab, SSD and MobileNet v2 behind on their real target."""
    import shutil

    from tflgpu.autotune.exchange import SHIPPED_DIR, NearestRecords, lent
    from tflgpu.autotune.tuner import KernelTraits, space_size
    from tflgpu.cache.records import TuningRecord
    from tflgpu.kernels import base
    from tflgpu.ops.layout import bhwc
    from tflgpu.runtime.tuning import generator_takes

    from .conftest import corpus_model, selected_steps

    shutil.copy(SHIPPED_DIR / name, tmp_path / name)
    device = json.loads((tmp_path / name).read_text())["devices"][0]
    identity, records = device["identity"], list(device["records"].values())
    near = NearestRecords(None, identity, shipped_dir=tmp_path)
    started, refused = 0, []
    for model in models:
        # (the plan's steps as the runtime selects them for that target, nothing compiled)
        selected = selected_steps(corpus_model(model), base.Target(**target), fuse_expansions=False)
        for s in selected.steps:
            if not s.specs or space_size(s.specs[0].space) < 2:
                continue
            layouts = {t: bhwc(selected.sg.tensors[t].shape) for sp in s.specs for t in sp.inputs + sp.outputs}
            traits = KernelTraits.of(s.op.name, s.specs, layouts, generator_takes(selected.make, s.op, s.epilogue))
            held = [r for r in records if r["family"] == traits.family and len(r["shape"]) == len(traits.shape)]
            if not held:
                continue  # (a kind of kernel this file never held: the chain's other files start it)
            found = near.find("a key of no record", traits)
            assert found is not None and f"this device ({identity['device']})" in found.level, (model, s.op.index)
            own = [r for r in held if tuple(r["shape"]) == traits.shape]
            if any(traits.takes(lent(TuningRecord.from_json(r), traits.shape).params) for r in own):
                assert found.record.shape == traits.shape, (model, s.op.index, found.level)
            elif own:  # (a record its generator refuses now: the H200's 7x7 320 -> 1,280 tile of 32 x 8 pixels
                # stages too much local memory for the sum in 4 shares a GPU's deep pointwise conv takes since)
                refused.append((model, s.op.index))
            started += 1
    assert started >= 10 and len(refused) <= started // 10, refused
