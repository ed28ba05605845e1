"""First start: a quick build first and the optimized one in the background, a background search whose winners
are swapped in between invokes, records that survive an exit mid-search, one searcher per kernel, and nothing
written outside tflgpu's cache."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.default_model import DEFAULT_MODEL_PATH, INPUT_SHAPE

from .conftest import assert_close, litert, run_model, start_in_new_process

MODEL = str(DEFAULT_MODEL_PATH)
FEED = [np.random.default_rng(7).uniform(-1, 1, INPUT_SHAPE).astype(np.float32)]


@pytest.fixture(scope="module")
def reference():
    return run_model(litert(), Path(MODEL).read_bytes(), FEED)[0]


def invoke(it) -> np.ndarray:
    it.set_tensor(it.get_input_details()[0]["index"], FEED[0])
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_tiered_start_runs_quick_code_then_the_optimized_program(opencl_device, new_process, tmp_path, reference):
    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=True, tuning="none"))
    it.allocate_tensors()
    plan = it.gpu_plan
    assert plan.build_stats["tier"] == "quick" and plan.cpu_op_count == 0
    assert_close(invoke(it), reference)  # the unoptimized build computes the same model
    assert it.wait_background(120)
    status = it.tuning_status()
    assert status.finished and not status.last_error
    quick_kernels = [k for s in plan.steps for k in s.kernels]
    assert_close(invoke(it), reference)  # this invoke installed the optimized kernels first
    assert plan.build_stats["tier"] == "optimized" and it.tuning_status().compile_tier == "optimized"
    assert not set(map(id, quick_kernels)) & {id(k) for s in plan.steps for k in s.kernels}
    # the optimized binary was stored: the next start loads it and has nothing left to do in the background
    warm = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=True, tuning="none"))
    assert warm.gpu_plan.build_stats["plan"] == "cache" and warm.gpu_plan.build_stats["tier"] == "optimized"
    assert warm.gpu_plan.build_stats["source_builds"] == 0 and warm.tuning_status() is None
    warm.allocate_tensors()
    assert_close(invoke(warm), reference)


def test_litert_order_for_another_batch_builds_one_plan(opencl_device, tmp_path, reference, monkeypatch):
    """LiteRT's order for another batch: construct, resize_tensor_input, allocate_tensors. The constructor builds
    no plan (it built one for the stored shapes, whose compile the resize then threw away: MobileNet v2 at batch 2,
    first result 3.3-3.4 -> 1.9-2.0 s); allocate_tensors builds the one it runs."""
    from tflgpu.runtime import plan as plans

    built, real = [], plans.build_plan
    monkeypatch.setattr(plans, "build_plan", lambda *a, **kw: built.append(a[-1]) or real(*a, **kw))  # (shapes)
    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none"))
    assert built == []
    idx = it.get_input_details()[0]["index"]
    it.resize_tensor_input(idx, (2, *INPUT_SHAPE[1:]))
    it.allocate_tensors()
    assert built == [[(2, *INPUT_SHAPE[1:])]]
    it.set_tensor(idx, np.concatenate([FEED[0], FEED[0]]))
    it.invoke()
    assert_close(it.get_tensor(it.get_output_details()[0]["index"]), np.concatenate([reference, reference]))
    assert it.backend.startswith("opencl") and len(built) == 1


def test_a_plan_resized_away_before_allocate_builds_nothing_more(opencl_device, new_process, tmp_path, reference,
                                                                  monkeypatch):
    """A plan asked for before a resize (``gpu_plan`` builds it for the shapes then set), replaced by the resize's
    allocate_tensors, was never used: its optimized build never starts (it held the process's one build at a time
    for seconds: MobileNet v2 at batch 2: first result 7.6-8.9 s, then 3.3-3.7), and the plan allocate_tensors
    makes runs, then gets its own."""
    import threading

    from tflgpu.runtime import upgrades

    builders, real = [], upgrades.build_program  # (the threads of the tier-ups' builds)
    monkeypatch.setattr(upgrades, "build_program", lambda *a, **k: builders.append(threading.current_thread())
                        or real(*a, **k))
    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=True, tuning="none"))
    first = it.gpu_plan
    work = first.background
    assert first.build_stats["tier"] == "quick" and work is not None
    idx = it.get_input_details()[0]["index"]
    it.resize_tensor_input(idx, (2, *INPUT_SHAPE[1:]))
    it.allocate_tensors()
    assert it.gpu_plan is not first
    work.thread.join(60)
    assert not work.thread.is_alive() and work.thread not in builders
    x = np.concatenate([FEED[0], FEED[0]])
    it.set_tensor(idx, x)
    it.invoke()
    assert_close(it.get_tensor(it.get_output_details()[0]["index"]), np.concatenate([reference, reference]))
    assert it.wait_background(120) and builders == [it.gpu_plan.background.thread]
    it.invoke()  # (installs it)
    assert it.gpu_plan.build_stats["tier"] == "optimized"


def test_hot_swap_installs_new_kernels_between_invokes(opencl_device, tmp_path, reference):
    """A retuned step's kernels are queued, not installed; the next invoke installs them before it runs."""
    from tflgpu.runtime.upgrades import retune_steps

    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none"))
    it.allocate_tensors()
    plan = it.gpu_plan
    conv = next(s for s in plan.steps if s.op.name == "CONV_2D" and s.device == "gpu" and s.specs[0].space)
    before = conv.specs[0].params
    params = {**before, "tile_x": 1 if before["tile_x"] != 1 else 2, "tile_s": 2, "lanes": 4, "vec_hint": "float4"}
    old_kernels = list(conv.kernels)
    retune_steps(plan, [conv.op.index], params, "CONV_2D")
    assert conv.kernels == old_kernels and conv.specs[0].params == before  # nothing live changed yet
    assert_close(invoke(it), reference)
    assert conv.params == params and conv.specs[0].params == params and conv.kernels != old_kernels
    assert_close(invoke(it), reference)


def test_a_program_compiled_in_this_process_is_not_compiled_again(opencl_device, new_process, reference):
    """A second interpreter of a model in one process, without a disk cache, builds its programs from the binaries
    the first compiled (``kernels.program.COMPILED``), and starts on the optimized tier where a tiered start
    would compile a quick program first; it computes the same."""
    delegate = {"cache": False, "tuning": "none", "tiered_compile": True}
    first = Interpreter(MODEL, delegate=GpuDelegate(**delegate))
    assert first.gpu_plan.build_stats["tier"] == "quick" and first.gpu_plan.build_stats["source_builds"] >= 1
    assert first.wait_background(120)
    first.allocate_tensors()
    got = invoke(first)  # (the optimized program, installed at this invoke)
    second = Interpreter(MODEL, delegate=GpuDelegate(**delegate))
    second.allocate_tensors()
    stats = second.gpu_plan.build_stats
    assert stats["tier"] == "optimized" and stats["source_builds"] == 0 and stats["memory_loads"] >= 1, stats
    assert second.tuning_status() is None  # (nothing left to build in the background)
    np.testing.assert_array_equal(invoke(second), got)
    assert_close(got, reference)


def test_compiled_binaries_are_bounded_by_bytes_least_recently_used_first():
    from tflgpu.kernels.program import CompiledBinaries

    memo = CompiledBinaries(limit=10)
    memo.put(1, "a", b"aaaa")
    memo.put(1, "b", b"bbbb")
    assert memo.get(1, "a") == b"aaaa" and memo.get(2, "a") is None  # (per device)
    memo.put(1, "c", b"cccc")  # 12 bytes: the least recently used ("b") goes
    assert memo.get(1, "b") is None and memo.get(1, "a") == b"aaaa" and memo.get(1, "c") == b"cccc"
    memo.put(1, "big", b"x" * 11)  # larger than the whole limit: not kept, nothing evicted for it
    assert memo.get(1, "big") is None and memo.get(1, "a") == b"aaaa"
    memo.put(1, "a", b"aaaaaa")  # replaced: counted at its new size (6 + 4)
    assert memo.get(1, "a") == b"aaaaaa" and memo.get(1, "c") == b"cccc"


def test_a_binary_loaded_from_the_cache_is_held_for_the_process_too(opencl_device, new_process, tmp_path):
    import pyopencl as cl

    from tflgpu.cache.store import CacheStore
    from tflgpu.kernels.program import COMPILED, build_program

    src = ["__kernel void twice(__global float* a) { a[get_global_id(0)] *= 2.0f; }"]
    store = CacheStore(tmp_path)
    stats = [{}, {}, {}]
    build_program(cl, cl.Context([opencl_device.cl_device]), src, False, store, opencl_device, stats[0])
    COMPILED.clear()  # (a new process, with the binary in its cache)
    build_program(cl, cl.Context([opencl_device.cl_device]), src, False, store, opencl_device, stats[1])
    ctx = cl.Context([opencl_device.cl_device])
    program = build_program(cl, ctx, src, False, None, opencl_device, stats[2])  # no cache: from memory
    assert stats == [{"source_builds": 1}, {"binary_loads": 1}, {"memory_loads": 1}]
    a = np.arange(4, dtype=np.float32)
    queue = cl.CommandQueue(ctx)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
    program.twice(queue, (4,), None, buf)
    cl.enqueue_copy(queue, a, buf)
    np.testing.assert_array_equal(a, [0, 2, 4, 6])


def test_background_search_keeps_invokes_correct_and_records_every_kernel(opencl_device, tmp_path, reference):
    from tflgpu.autotune.records import CacheTuningDB

    # (three candidates a kernel: every kernel is searched, swapped in and recorded all the same)
    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=True,
                                                 tuning="background", tuning_budget_s=120, tuning_trials=3))
    it.allocate_tensors()
    total = it.tuning_status().kernels_left
    assert total > 5
    started = {s.op.index: s.params for s in it.gpu_plan.steps if s.params}
    # invoke all through the tier-up and the search, with pauses it runs in (it starts no compile within 0.5 s
    # of an invoke): the first at once, on the start's kernels (a device whose compiles are cached, PoCL's, ends
    # the whole search within the first pause), the last on every kernel the search installed
    outputs = [invoke(it)]
    while not it.wait_background(2.0):
        outputs += [invoke(it) for _ in range(3)]
    outputs.append(invoke(it))
    for out in outputs:
        assert_close(out, reference)
    status = it.tuning_status()
    assert status.finished and not status.last_error and status.kernels_left == 0
    # (and the convs of any block it left unfused, which the start did not launch: searched next)
    assert status.kernels_done == status.kernels_searched >= total
    db = CacheTuningDB(it.gpu_plan.store)
    dev = it.gpu_plan.device.identity.key()
    keys = {k for d, k, _ in db.items() if d == dev}
    assert len(keys) == status.kernels_searched  # every kernel of the model searched and recorded, once
    tuned = {s.op.index: s.params for s in it.gpu_plan.steps if s.params}
    # the plan runs what a start from those records runs: the winners (a block the search left unfused runs its
    # convs' winners), unless together they were slower than the start (a busy CPU device's timing may say so): then
    # the start's kernels are back and recorded (test_kernels_slower_together_than_the_start_are_put_back)
    fresh = Interpreter(MODEL, delegate=GpuDelegate(cache=False, tuning="none", tuning_db=db)).gpu_plan
    assert tuned == {s.op.index: s.params for s in fresh.steps if s.params}, (status, started)
    if status.reverted:
        assert tuned == started
    # the next start uses the stored tuned plan: no search, the winners' parameters in place
    again = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=True,
                                                    tuning="background"))
    assert again.gpu_plan.build_stats["plan"] == "cache" and again.tuning_status() is None
    assert {s.op.index: s.params for s in again.gpu_plan.steps if s.params} == tuned
    again.allocate_tensors()
    assert_close(invoke(again), reference)


def _idle_background(plan):
    """A plan's Background with no jobs of its own: its gate and status, for a job's parts run from the test."""
    from tflgpu.runtime.background import Background

    bg = Background(plan, [], 0, "optimized")
    assert bg.wait(30)
    return bg


def test_a_stopped_plan_s_launch_in_flight_ends_before_close_returns():
    """Activity.wait_launches (GpuPlan.close, before the next plan of a resize enqueues on the shared queue): it
    waits for an ``exclusive`` block in flight, and no block starts once the plan is stopped."""
    import threading

    from tflgpu.runtime.background import Activity, Stopped

    act, inside, done = Activity(), threading.Event(), []

    def launch():
        with act.exclusive(quiet_s=0.0):
            inside.set()
            time.sleep(0.3)
            done.append(time.monotonic())

    t = threading.Thread(target=launch)
    t.start()
    assert inside.wait(10)
    act.stop()
    act.wait_launches()
    returned = time.monotonic()
    assert done and done[0] <= returned
    t.join()
    with pytest.raises(Stopped), act.exclusive(quiet_s=0.0):
        pass


def test_kernels_slower_together_than_the_start_are_put_back(opencl_device, tmp_path, reference):
    """The end-to-end check after a search (upgrades.check_plan), on real timings: a plan whose heaviest step
    launches its kernels ten times over (the same output, ten times its work) is slower than its start, and the
    start's kernels go back in at the next invoke; kernels faster than the start stay."""
    from dataclasses import replace

    from tflgpu.runtime.upgrades import check_plan, kernel_sets

    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=False, tuning="none"))
    it.allocate_tensors()
    assert_close(invoke(it), reference)
    plan = it.gpu_plan
    bg = _idle_background(plan)
    with bg.activity.exclusive():
        start = kernel_sets(plan)
    heavy = max(start, key=lambda i: sum(sp.flops for sp in start[i].specs))
    step = plan.steps[heavy]
    step.kernels, step.specs, plan.io.args[heavy] = step.kernels * 10, step.specs * 10, plan.io.args[heavy] * 10
    assert check_plan(bg, start)
    assert bg.status.reverted and bg.status.plan_tuned_us > bg.status.plan_start_us * 1.03 > 0
    assert len(step.kernels) == 10 * len(start[heavy].kernels)  # (queued, not installed: no invoke since)
    assert_close(invoke(it), reference)
    assert step.kernels is start[heavy].kernels and step.specs is start[heavy].specs
    # the other way round: a start ten times as heavy at that step, the plan as it is now is kept
    bg = _idle_background(plan)
    slow = {**start, heavy: replace(start[heavy], kernels=start[heavy].kernels * 10, specs=start[heavy].specs * 10)}
    assert not check_plan(bg, slow)
    assert not bg.status.reverted and 0 < bg.status.plan_tuned_us < bg.status.plan_start_us
    assert not plan.swaps.pending() and step.kernels is start[heavy].kernels


def test_a_search_slower_end_to_end_records_the_start_as_its_choice(opencl_device, tmp_path, reference, monkeypatch):
    """What follows the end-to-end verdict against a search: its kernels run with the start's parameters, each
    searched kernel's record holds the start's parameters (one trial more than the search's, so it replaces
    it), no tuned plan is stored, and the next start takes the start's parameters with no search."""
    from tflgpu.autotune import tuner
    from tflgpu.autotune.records import CacheTuningDB
    from tflgpu.runtime import upgrades

    monkeypatch.setattr(tuner, "MIN_GAIN", -1.0)  # (every search takes its best candidate: each kernel "wins")
    # (the verdict: the winners together twice as slow as the start; check_plan's own timing is tested above)
    monkeypatch.setattr(upgrades, "time_kernel_sets", lambda bg, sets: [[1e-3] * 5, [2e-3] * 5])
    options = {"serialization_dir": tmp_path, "tiered_compile": False, "tuning": "background"}
    it = Interpreter(MODEL, delegate=GpuDelegate(**options, tuning_budget_s=120, tuning_trials=2))
    it.allocate_tensors()
    started = {s.op.index: s.params for s in it.gpu_plan.steps}
    assert_close(invoke(it), reference)
    assert it.wait_background(600)
    status = it.tuning_status()
    assert not status.last_error and status.kernels_improved == status.kernels_searched > 0 and status.reverted
    assert (status.plan_start_us, status.plan_tuned_us) == (1e3, 2e3)
    assert_close(invoke(it), reference)
    assert {s.op.index: s.params for s in it.gpu_plan.steps} == started
    db = CacheTuningDB(it.gpu_plan.store)
    dev = it.gpu_plan.device.identity.key()
    records = {k: r for d, k, r in db.items() if d == dev}
    assert len(records) == status.kernels_searched and all(r.best_us == r.default_us for r in records.values())
    # (the steps' own kernels: a block whose search left it unfused has its convs searched as parts, whose starts
    # are their own, not a step's)
    steps = {k.key for k in it.gpu_plan.tuning_results}
    assert steps & records.keys()
    assert {json.dumps(r.params, sort_keys=True) for k, r in records.items() if k in steps} <= \
        {json.dumps(p, sort_keys=True) for p in started.values()}
    again = Interpreter(MODEL, delegate=GpuDelegate(**options))
    assert again.gpu_plan.build_stats["plan"] == "cache" and again.tuning_status() is None
    assert {s.op.index: s.params for s in again.gpu_plan.steps} == started
    again.allocate_tensors()
    assert_close(invoke(again), reference)


_CHILD = r"""
import json, sys, time, numpy as np
from tflgpu import GpuDelegate, Interpreter
it = Interpreter(sys.argv[1], delegate=GpuDelegate(serialization_dir=sys.argv[2], tiered_compile=True,
                                                   tuning="background", tuning_budget_s=120,
                                                   tuning_trials=2))  # (resuming is tested, not search depth)
it.allocate_tensors(); it.invoke()
stop_after = int(sys.argv[3])
while it.tuning_status().kernels_done < stop_after and not it.wait_background(0.05):
    pass
s = it.tuning_status()
print(json.dumps({"done": s.kernels_done, "left": s.kernels_left, "searched": s.kernels_searched}))
"""


def _child(tmp_path, stop_after: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TFLGPU_TIERED_COMPILE"}
    out = subprocess.run([sys.executable, "-c", _CHILD, MODEL, str(tmp_path), str(stop_after)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_process_that_exits_mid_search_leaves_records_the_next_one_resumes_from(opencl_device, tmp_path):
    from tflgpu.autotune.records import CacheTuningDB
    from tflgpu.cache.store import CacheStore

    first = _child(tmp_path, stop_after=2)  # exits while the search is under way
    assert 2 <= first["done"] and first["left"] > 0
    recorded = len(list(CacheTuningDB(CacheStore(tmp_path)).items()))
    assert recorded >= first["searched"]  # each finished search was recorded whole
    second = _child(tmp_path, stop_after=10**6)
    assert second["left"] == 0
    # only what the first process had not finished, each recorded (and the convs of any block a search left
    # unfused, which the first start did not count): nothing searched twice
    assert second["searched"] >= first["done"] + first["left"] - recorded
    assert len(list(CacheTuningDB(CacheStore(tmp_path)).items())) == recorded + second["searched"]


def test_records_of_ones_own_are_claimed_apart():
    """A searcher whose records are an in-memory database (a cache-less delegate's) is kept from another only by
    searchers of that database: one of another could not read its result, so it searches the kernel itself."""
    from tflgpu.autotune.records import MemoryTuningDB, StagedTuningDB

    one, other = MemoryTuningDB(), MemoryTuningDB()
    with one.claim("dev", "k1") as mine, one.claim("dev", "k1") as again, other.claim("dev", "k1") as theirs:
        assert mine and not again and theirs
    with StagedTuningDB(one).claim("dev", "k1") as staged, one.claim("dev", "k1") as base:
        assert staged and not base  # (a staged view shares its base's records)


def test_one_searcher_per_kernel(opencl_device, tmp_path):
    """Two interpreters on one cache never search the same kernel: in-process claims and, across processes,
    the claim files."""
    from tflgpu.autotune.records import CacheTuningDB
    from tflgpu.cache.store import CacheStore

    db = CacheTuningDB(CacheStore(tmp_path))
    with db.claim("dev", "k1") as mine, db.claim("dev", "k1") as again, db.claim("dev", "k2") as other:
        assert mine and not again and other
        held = subprocess.run([sys.executable, "-c", "import sys\nfrom tflgpu.autotune.records import CacheTuningDB\n"
                               "from tflgpu.cache.store import CacheStore\n"
                               "db = CacheTuningDB(CacheStore(sys.argv[1]))\n"
                               "with db.claim('dev', 'k1') as a, db.claim('dev', 'k3') as b: print(a, b)",
                               str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert held.stdout.split() == ["False", "True"], held.stderr[-2000:]
    with db.claim("dev", "k1") as mine:
        assert mine  # released with the block

    # (two candidates a kernel: what is shared is which kernels each searches, not how far)
    a = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=True,
                                                tuning="background", tuning_budget_s=120, tuning_trials=2))
    b = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tiered_compile=True,
                                                tuning="background", tuning_budget_s=120, tuning_trials=2,
                                                model_token="same-model-other-plan"))
    for it in (a, b):
        it.allocate_tensors()
    assert a.wait_background(600) and b.wait_background(600)
    sa, sb = a.tuning_status(), b.tuning_status()
    assert sa.kernels_left == sb.kernels_left == 0
    # each kernel searched once, by one (each search is recorded: a kernel searched twice would be one record),
    # every kernel either took up among them (the convs of a block one of them left unfused are that one's alone)
    records = len(list(db.items()))
    assert sa.kernels_searched + sb.kernels_searched == records >= max(sa.kernels_done, sb.kernels_done)


def test_a_cold_start_writes_nothing_outside_tflgpus_cache(tmp_path):
    """pyopencl's compiler and invoker caches, and anything else, stay out of the user's cache directory."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    xdg.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TFLGPU_CACHE_DIR", "TFLGPU_TUNING",
                                                            "TFLGPU_TIERED_COMPILE", "PYOPENCL_NO_CACHE")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(xdg))
    code = ("import numpy as np, sys\nfrom tflgpu import GpuDelegate, Interpreter\n"
            "it = Interpreter(sys.argv[1], delegate=GpuDelegate(tuning_budget_s=3)); it.allocate_tensors(); "
            "it.invoke(); it.wait_background(120); it.invoke()\n"
            "print(it.gpu_plan is not None, it.gpu_plan.store.root)")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, MODEL], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "True", out.stdout
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written, "the cache should hold the plan and its program"
    outside = [str(p) for p in written if xdg / "tflgpu" not in p.parents]
    assert not outside, f"written outside tflgpu's cache: {outside[:10]}"
    assert time.perf_counter() - t0 < 600


def test_numba_is_imported_only_when_a_numba_kernel_runs(opencl_device, tmp_path):
    """numba and llvmlite (~70 MiB, ~0.3 s) load when a CPU kernel first runs (ops.jit): a fully delegated model
    never loads them, neither at its first start, whose shapes come from ops.shapes' rules instead of its CPU
    kernels (a run of them on a cold numba cache took MobileNet v2's first start from 2 s to 16 s), nor from its
    stored plan; the CPU path does, and its kernels run as compiled."""
    assert start_in_new_process(MODEL, tmp_path)[:2] == ["0", "built"]
    assert start_in_new_process(MODEL, tmp_path)[:2] == ["0", "cache"]
    assert start_in_new_process(MODEL, tmp_path, delegated=False)[:2] == ["1", "cpu"]


def test_deferred_kernels_compile_as_numba_kernels():
    """Once materialized, a deferred kernel's module holds numba's dispatcher and numba's prange (a parallel
    loop stays parallel), and a kernel calling another compiles."""
    import numba

    from tflgpu.cpu import conv, quantized
    from tflgpu.ops import jit

    jit.materialize()
    assert conv.prange is numba.prange and quantized.prange is numba.prange
    assert isinstance(conv._depthwise, numba.core.registry.CPUDispatcher)
    assert conv._depthwise.targetoptions.get("parallel") is True
    x = np.arange(-40, 40, dtype=np.int64)  # (_mbqm_ufunc's body calls the _mbqm kernel)
    got = quantized.multiply_by_quantized_multiplier(x, np.int64(1 << 30), np.int64(1))
    np.testing.assert_array_equal(got, x)  # x * 2 * 0.5


NUMBA_RACE = r"""
import os, sys, time
import numpy as np
from tflgpu.ops import jit
from tflgpu.cpu import reduce
jit.materialize()
ready, n = sys.argv[1], int(sys.argv[2])
open(f"{ready}.{os.getpid()}", "w").close()
while sum(f.startswith(os.path.basename(ready) + ".") for f in os.listdir(os.path.dirname(ready))) < n:
    time.sleep(0.01)
reduce._mean_pixels(np.zeros((1, 4, 4, 8), np.float32))  # (a new signature: compiled, or loaded from the cache)
stats = reduce._mean_pixels.stats
print(sum(stats.cache_misses.values()), sum(stats.cache_hits.values()))
"""


def test_processes_starting_together_compile_a_cpu_kernel_once(tmp_path):
    """Three processes on a cold numba cache call the same kernel at the same moment: one compiles it, and the
    others wait for it and load what it wrote to numba's cache (ops.jit's lock beside the cache index), instead
    of each compiling it (a cold CPU-kernel run of MobileNet v2 compiles for 30 s on 2 cores)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    procs = [subprocess.Popen([sys.executable, "-c", NUMBA_RACE, str(tmp_path / "ready"), "3"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    counts = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        counts.append(tuple(int(n) for n in out.split()))
    assert sorted(counts) == [(0, 1), (0, 1), (1, 0)], "(compiled, loaded from the cache) per process"


def test_a_plan_keeps_no_host_copy_of_its_weights(opencl_device, rng, tmp_path):
    """Once uploaded, a plan's kernels keep only their constants' sizes (kernels.common.Uploaded), and the model
    file's pages are released; a CPU op (FLOOR_DIV: no OpenCL kernel) reading a constant afterwards reads it back
    from the file, and the model still matches LiteRT."""
    from tflgpu.kernels.common import Uploaded
    from tflgpu.model.builder import ModelBuilder

    from .test_separable import separable_model

    model, _ = separable_model(rng)
    path = tmp_path / "block.tflite"
    path.write_bytes(model)
    it = Interpreter(model_path=str(path), delegate=GpuDelegate(cache=False, tuning_db=False))
    consts = [a.value for s in it.gpu_plan.steps for sp in s.specs for a in sp.args if a.kind in ("const", "const32")]
    assert consts and all(isinstance(v, Uploaded) and v.size > 0 for v in consts)
    assert all(it.gpu_plan.spec_bytes(sp) > 0 for s in it.gpu_plan.steps for sp in s.specs)

    b = ModelBuilder()
    x = b.input("x", (2, 8))
    y, z = b.tensor("y", (2, 8)), b.tensor("z", (2, 8))
    b.op("RELU", [x], [y])
    b.op("FLOOR_DIV", [y, b.const("d", rng.uniform(1, 3, (2, 8)).astype(np.float32))], [z])
    b.output(z)
    path.write_bytes(b.build())
    feeds = [rng.uniform(-10, 10, (2, 8)).astype(np.float32)]
    it = Interpreter(model_path=str(path), delegate=GpuDelegate(cache=False, tuning_db=False))
    assert it.gpu_plan.cpu_op_count == 1
    got = run_model(Interpreter, path, feeds, delegate=GpuDelegate(cache=False, tuning_db=False))
    assert_close(got[0], run_model(litert(), path, feeds)[0])


_RESIDENCY_PROBE = """
import sys, numpy as np
from tflgpu import GpuDelegate, Interpreter
from tflgpu.runtime.device import list_devices
from tflgpu.runtime.residency import runtime_resident_kib
list_devices()
before = runtime_resident_kib()
it = Interpreter(model_path=sys.argv[1], delegate=GpuDelegate(tuning="none", cache=False, tuning_db=False))
it.allocate_tensors()
it.wait_background()
x = np.load(sys.argv[2])
it.set_tensor(it.get_input_details()[0]["index"], x)
it.invoke()
np.save(sys.argv[3], it.get_tensor(it.get_output_details()[0]["index"]))
print(before, runtime_resident_kib())
"""


def test_a_built_plan_gives_back_the_runtime_librarys_startup_pages(opencl_device, rng, tmp_path):
    """The OpenCL runtime's libraries (those the first platform query maps) leave pages resident that only
    their start-up touched; once a plan is built and its background work done, those read-only pages are
    released (runtime.residency), and the runtime, reading back what it needs, still computes the model right."""
    from .test_separable import separable_model

    model, feeds = separable_model(rng)
    path = tmp_path / "block.tflite"
    path.write_bytes(model)
    x = feeds[0]
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "TFLGPU_DEVICE": str(opencl_device.index)}
    done = subprocess.run([sys.executable, "-c", _RESIDENCY_PROBE, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = (int(v) for v in done.stdout.split()[-2:])
    assert before > 1024, "the first platform query mapped no runtime library with resident read-only pages"
    assert after < before / 2, (before, after)
    assert_close(np.load(tmp_path / "y.npy"), run_model(litert(), path, [x])[0])


def test_a_swap_to_a_form_with_a_new_intermediate_gets_its_buffer(opencl_device, tmp_path):
    """A background winner may store a value the plan's first form kept inside one kernel: a separable conv tuned to
    fused=False writes its depthwise output, a tensor the memory plan holds no buffer for. The swap brings a buffer
    for it (an NVIDIA GPU's background search stopped on a KeyError here), and the model still computes LiteRT's
    values."""
    from tflgpu.runtime.upgrades import retune_steps

    from .conftest import corpus_model

    model = corpus_model("mobilenet_v2_1.0_224.tflite")
    feed = np.random.default_rng(3).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
    reference = run_model(litert(), model.read_bytes(), [feed])[0]
    it = Interpreter(str(model), delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none"))
    it.allocate_tensors()
    plan = it.gpu_plan
    fused = [s for s in plan.steps if s.op.name == "TFLGPU_SEPARABLE_CONV" and s.specs[0].params.get("fused")]
    assert fused
    step = fused[0]
    held = set(plan.io.tensor_buffer)
    retune_steps(plan, [step.op.index], {"fused": False}, "TFLGPU_SEPARABLE_CONV")
    it.set_tensor(it.get_input_details()[0]["index"], feed)
    it.invoke()
    assert len(step.kernels) == 2 and set(plan.io.tensor_buffer) - held  # the pair, and their intermediate's buffer
    assert_close(it.get_tensor(it.get_output_details()[0]["index"]), reference)
