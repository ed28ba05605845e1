"""The autotuner on the OpenCL device: it picks the truly faster variant, never a wrong one, keeps to its
budgets, stores and reloads records (invalidated by a new generator version), shares one search
between processes, and tuned models still match LiteRT."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.autotune import FileTuningDB, MemoryTuningDB, TuneTask, TuningConfig, TuningRecord, tune_tasks
from tflgpu.autotune.measure import KernelBench
from tflgpu.autotune.tuner import KernelTuner
from tflgpu.kernels.base import generator_version
from tflgpu.kernels.common import Arg, KernelSpec
from tflgpu.ops.layout import Layout

from .conftest import assert_close, litert, run_model
from .oputil import conv_model, interior_conv_model

N = 1 << 15  # pixels (float4 each) of the synthetic kernel's tensors
LAYOUTS = {0: Layout(1, 1, N, 4), 1: Layout(1, 1, N, 4)}


def scale_kernel(params: dict, name: str = "scale") -> list[KernelSpec]:
    """y = 2x. ``slow`` burns cycles in a loop whose result is multiplied by 0 (IEEE keeps it; ``loops`` rounds of
    it, 300 where slow, else 1); ``wrong`` computes 3x; ``n`` only changes a comment (distinct code, same speed)."""
    loops = params.get("loops", 300 if params.get("slow", True) else 1)
    factor = 3.0 if params.get("wrong", False) else 2.0
    src = f"""// variant {params.get('n', 0)}
__kernel void {name}(__global const STORE_T* x, __global STORE_T* y) {{
  const int i = get_global_id(0);
  const float4 v = LD4(x, i);
  float4 junk = v;
  for (int k = 0; k < {loops}; ++k) junk = sin(junk) + v;
  const float4 r = v * {factor}f + junk * 0.0f;
  ST4(y, i, r);
}}"""
    return [KernelSpec(name, src, (N,), None, [Arg("tensor", 0), Arg("tensor", 1)], [0], [1])]


@pytest.fixture(scope="module")
def ctx(opencl_device):
    import pyopencl as cl

    return cl.Context([opencl_device.cl_device])


def bench(ctx, device):
    import pyopencl as cl

    return KernelBench(cl, ctx, device, False, LAYOUTS)


def task(space, default, key="test-scale"):
    return TuneTask(key, "TEST", scale_kernel, space, default, LAYOUTS)


def test_picks_the_faster_variant_and_rejects_a_wrong_one(ctx, opencl_device):
    t = task({"slow": [True, False], "wrong": [False, True]}, {"slow": True, "wrong": False})
    tuner = KernelTuner(t, bench(ctx, opencl_device), "dev", mode="exhaustive", trials=None)
    r = tuner.run(None)
    assert r.params == {"slow": False, "wrong": False}, r
    assert r.speedup > 3, r  # 300 sin() per element vs 1
    assert r.rejected >= 1 and any("differs from the default" in why for why in r.reasons), r.reasons


def test_a_kernel_timed_again_is_not_built_again(ctx, opencl_device):
    """The confirmation times the default and the winner again (``compare``) on the programs built when they were
    first timed, and a plan swapping the winner in finds it too (the memo is shared): one build per kernel."""
    import pyopencl as cl

    from tflgpu.kernels.program import ProgramMemo, build_program, compiled_sources

    memo = ProgramMemo(capacity=2)
    b = KernelBench(cl, ctx, opencl_device, False, LAYOUTS, programs=memo)
    slow, fast = scale_kernel({"slow": True}), scale_kernel({"slow": False})
    b.time(slow)
    b.time(fast)
    assert b.compiles == 2
    b.compare(slow, fast, rounds=1)
    assert b.compiles == 2
    stats: dict = {}
    assert build_program(cl, ctx, compiled_sources(fast), False, stats=stats, memo=memo) is not None
    assert "source_builds" not in stats
    b.time(scale_kernel({"slow": True, "n": 1}))  # a third program: the memo keeps the last two
    b.time(slow)
    assert b.compiles == 4


def test_a_candidate_that_fails_to_compile_is_rejected(ctx, opencl_device):
    def make(params):
        specs = scale_kernel({"slow": True})
        if params.get("broken"):
            specs[0].source = specs[0].source.replace("sin(junk)", "undefined_function(junk)")
        return specs

    t = TuneTask("test-broken", "TEST", make, {"broken": [False, True]}, {"broken": False}, LAYOUTS)
    r = KernelTuner(t, bench(ctx, opencl_device), "dev", mode="exhaustive", trials=None).run(None)
    assert r.params == {} and r.rejected == 1 and "build failed" in r.reasons[0]


def test_a_slower_candidate_is_timed_and_cut_short_not_rejected(ctx, opencl_device):
    """A candidate whose first samples are already far slower than the best is cut short: the report counts it as
    timed ("cut short"), and "rejected" keeps to points that could not run or ran wrong (a report that said "1
    timed, 75 rejected" of a search that had timed them all read as a broken space)."""
    from tflgpu.tuning_report import _search_words

    def make(params):  # (the default, no params, is the fast and right kernel)
        return scale_kernel({"slow": params.get("slow", False), "wrong": params.get("wrong", False)})

    t = TuneTask("test-cut-short", "TEST", make, {"slow": [False, True], "wrong": [False, True]},
                 {"slow": False, "wrong": False}, LAYOUTS)
    r = KernelTuner(t, bench(ctx, opencl_device), "dev", mode="exhaustive", trials=None).run(None)
    assert r.params == {} and r.measured == 1, r
    # (slow and right: cut short; fast and wrong: rejected; slow and wrong: either, as the first check meets it)
    assert r.slower >= 1 and r.rejected >= 1 and r.slower + r.rejected == 3, r
    assert all("discarded early" not in why for why in r.reasons), r.reasons

    class Decided:  # (a report row's kernel, as the plan's tuning results hold it)
        source, result = "tuned", r

    words = _search_words(Decided)
    assert f"{1 + r.slower} timed ({r.slower} cut short)" in words and f"{r.rejected} rejected" in words, words


class HostDelay:
    """pyopencl, except that each kernel enqueue takes ``delay(kernel, local_size)`` seconds more host time."""

    def __init__(self, delay):
        import pyopencl

        self._cl, self.delay = pyopencl, delay

    def __getattr__(self, name):
        return getattr(self._cl, name)

    def enqueue_nd_range_kernel(self, queue, kernel, global_size, local_size, *args, **kwargs):
        time.sleep(self.delay(kernel, local_size))
        return self._cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size, *args, **kwargs)


def slow_enqueue(seconds: float) -> HostDelay:
    """Enqueueing a kernel without a work-group size takes ``seconds`` more host time (the way NVIDIA's OpenCL takes
    ~5 us more for one)."""
    return HostDelay(lambda kernel, local_size: seconds if local_size is None else 0.0)


def test_a_candidate_costing_the_host_more_loses(ctx, opencl_device):
    """The same kernel, with and without a work-group size: the same device time, but the one without costs 20 ms of
    host time per enqueue. A sample costs the longer of the two, so the tuner picks the explicit work-group, which
    device times alone (a tie) would not."""
    def make(params):
        spec = scale_kernel({"slow": False})[0]
        spec.local_size = params.get("wg")
        return [spec]

    slow = slow_enqueue(0.02)  # (a margin a loaded 2-core machine does not close: 3 ms once did, in a full run)
    t = TuneTask("test-host", "TEST", make, {"wg": [None, (64,)]}, {"wg": None}, LAYOUTS)
    r = KernelTuner(t, KernelBench(slow, ctx, opencl_device, False, LAYOUTS), "dev", mode="exhaustive",
                    trials=None).run(None)
    assert r.params == {"wg": (64,)} and r.default_us >= 10_000 > r.best_us, r


def test_a_sample_costs_its_device_time_and_half_its_hosts_excess():
    """autotune.measure.step_cost: the device's span, plus the share of the enqueues' time beyond it (half by
    default; 1: the longer of the two, 0: the device's alone)."""
    from tflgpu.autotune.measure import HOST_EXCESS_SHARE, step_cost

    assert HOST_EXCESS_SHARE == 0.5
    assert step_cost(10.0, 30.0) == 30.0 and step_cost(30.0, 10.0) == 20.0
    assert step_cost(30.0, 10.0, share=1.0) == 30.0 and step_cost(30.0, 10.0, share=0.0) == 10.0


@pytest.mark.parametrize("share,wins", [(None, "quick"), (1.0, "busy")])
def test_device_time_under_the_enqueues_counts(ctx, opencl_device, share, wins):
    """Two candidates whose enqueues take longer than their kernels run: "busy" runs D on the device (~1.5 ms on
    the 2-core EPYC, ~7.5 on the 2-core Xeon), "quick" far less; their enqueues take 2.7 D and 3 D. Costed as the
    longer of the two times (share 1), both are their enqueues and "busy" wins by its 0.3 D less; by default (half
    the host's excess) "quick" wins by the device time it saves, which a device-bound plan gets whole."""
    def make(params):  # (the default: {})
        kind = params.get("kind", "busy")
        return scale_kernel({"loops": {"busy": 8, "quick": 0}[kind]}, name=kind)

    busy, quick = (bench(ctx, opencl_device).time(make({"kind": k})) for k in ("busy", "quick"))
    assert busy.device_us > 3 * quick.device_us, (busy, quick)  # (the premise: "quick" saves most of D)
    host = {"busy": 2.7 * busy.device_us * 1e-6, "quick": 3.0 * busy.device_us * 1e-6}  # (seconds an enqueue)
    slow = HostDelay(lambda kernel, local_size: host[kernel.function_name])
    t = TuneTask("test-device-under-host", "TEST", make, {"kind": ["busy", "quick"]}, {"kind": "busy"}, LAYOUTS)
    b = KernelBench(slow, ctx, opencl_device, False, LAYOUTS, host_share=share)
    r = KernelTuner(t, b, "dev", mode="exhaustive", trials=None).run(None)
    assert r.params.get("kind", "busy") == wins, r

def test_a_host_bound_default_tries_its_launch_first(ctx, opencl_device):
    """A default whose enqueue takes longer than its kernel runs (20 ms more without a work-group size)
    can only gain from being launched differently: its search tries the work-group sizes before the knobs listed
    ahead of them (here 5 variants of a comment), so a budget of two candidates finds the explicit work-group."""
    def make(params):
        spec = scale_kernel({"slow": False, "n": params.get("n", 0)})[0]
        spec.local_size = params.get("local_size")
        return [spec]

    t = TuneTask("test-host-bound", "TEST", make, {"n": [0, 1, 2, 3, 4, 5], "local_size": [None, (64,)]},
                 {"n": 0, "local_size": None}, LAYOUTS)
    # (20 ms: a margin a loaded 2-core machine does not close; 3 ms did once, beside a full run and a fuzz run)
    tuner = KernelTuner(t, KernelBench(slow_enqueue(0.02), ctx, opencl_device, False, LAYOUTS), "dev", mode="fast",
                        trials=2)
    r = tuner.run(None)
    assert tuner.host_bound and r.params.get("local_size") == (64,), r


def test_a_few_trials_try_every_knob_before_a_second_value_of_any(ctx, opencl_device):
    """The first trials after the default are its one-knob neighbors, a knob at a time round by round: a fast or
    background search (10 trials) of a conv with a knob of 8 values ahead of its others reaches those others (a GPU
    conv's tile_x, ahead of its group tile's k_split and prefetch); where the default is bound by the host, every
    launch knob's value comes first."""
    t = task({"n": list(range(8)), "slow": [False, True], "wrong": [False]}, {"n": 0, "slow": False, "wrong": False})
    tuner = KernelTuner(t, bench(ctx, opencl_device), "dev", mode="fast", trials=3)
    assert [(p["n"], p["slow"]) for p in tuner.neighbors()] == [(1, False), (0, True), *((n, False) for n in range(2, 8))]
    def make(params):  # (as scale_kernel, launched with the candidate's work-group)
        spec = scale_kernel({"slow": False, "n": params.get("n", 0)})[0]
        spec.local_size = params.get("local_size")
        return [spec]

    t = TuneTask("test-order", "TEST", make, {"n": [0, 1, 2], "local_size": [None, (64,), (32,)]},
                 {"n": 0, "local_size": None}, LAYOUTS)
    tuner = KernelTuner(t, bench(ctx, opencl_device), "dev", mode="fast", trials=3)
    assert [(p["n"], p["local_size"]) for p in tuner.neighbors()] == [(1, None), (0, (64,)), (2, None), (0, (32,))]
    tuner.host_bound = True
    assert [(p["n"], p["local_size"]) for p in tuner.neighbors()] == [(0, (64,)), (0, (32,)), (1, None), (2, None)]


def test_trial_and_time_budgets(ctx, opencl_device):
    space = {"n": list(range(60)), "slow": [True]}  # 60 distinct kernels: optuna TPE
    b = bench(ctx, opencl_device)
    tuner = KernelTuner(task(space, {"n": 0, "slow": True}), b, "dev", mode="fast", trials=3)
    before = b.compiles
    r = tuner.run(None)
    assert r.strategy == "tpe"
    assert r.measured <= 1 + 3  # the default, then at most 3 compiled candidates
    assert b.compiles - before <= 1 + 3 + 2  # (+ two builds if a winner is confirmed against the default)

    tuner = KernelTuner(task(space, {"n": 0, "slow": True}, key="test-time"), bench(ctx, opencl_device), "dev",
                        mode="exhaustive", trials=None)
    tuner.measure_default()
    t0 = time.perf_counter()
    r = tuner.run(1.0)
    assert time.perf_counter() - t0 < 1.0 + 5.0  # a started candidate finishes, then the search stops
    assert r.measured < 60


def test_model_budget_shared_across_kernels(ctx, opencl_device):
    tasks = [task({"n": list(range(60)), "slow": [True]}, {"n": 0, "slow": True}, key=f"k{i}") for i in range(3)]
    t0 = time.perf_counter()
    results = tune_tasks(tasks, lambda t: bench(ctx, opencl_device), "dev",
                         TuningConfig(mode="exhaustive", budget_s=2.0))
    assert time.perf_counter() - t0 < 2.0 + 8.0  # defaults are timed first, then the budget is split
    assert len(results) == 3


class SlowBench(KernelBench):
    """A bench whose every timing takes ``extra_s`` longer (a kernel whose candidates compile slowly)."""

    extra_s = 0.8

    def time(self, specs, *args, **kw):
        time.sleep(self.extra_s)
        return super().time(specs, *args, **kw)


def test_a_slow_kernel_gets_a_search_the_model_budget_has_room_for(ctx, opencl_device):
    """A kernel whose even share of the model budget cannot time one candidate (each takes ``extra_s`` here) gets
    what one needs while the budget has it: searched and recorded, not left for the next start while the kernels
    after it leave their shares unused."""
    import pyopencl as cl

    def looping(key, loops):  # (the slowest default is searched first)
        return TuneTask(key, "TEST", lambda p: scale_kernel({"loops": loops, **p}), {"n": list(range(60))}, {"n": 0},
                        LAYOUTS)

    tasks = [looping("slow-trials", 20), looping("quick0", 1), looping("quick1", 1)]

    def bench_for(t):
        kind = SlowBench if t.key == "slow-trials" else KernelBench
        return kind(cl, ctx, opencl_device, False, LAYOUTS)

    # the slow kernel's even share (what is left of 5 s after the defaults, over 3) is shorter than the two trials
    # (2 x 0.8 s) a search leaves itself at the end; it gets the three trials (2.4 s) one candidate needs instead
    # (timed: measured whole, or cut short as slower than the best, which a loaded machine makes of most of them)
    results = {r.key: r for r in tune_tasks(tasks, bench_for, "dev", TuningConfig(mode="fast", budget_s=5.0, trials=2))}
    slow = results["slow-trials"]
    assert slow.decided and slow.measured + slow.slower >= 2, slow
    assert all(r.decided for r in results.values()), results


def test_records_roundtrip_and_generator_version(tmp_path):
    db = FileTuningDB(tmp_path / "t.json")
    rec = TuningRecord({"tile_x": 2, "local_size": (8, 1, 1)}, 100.0, 50.0, 7, "CONV_2D")
    db.put("dev", "k1", rec)
    got = FileTuningDB(tmp_path / "t.json").get("dev", "k1")
    assert got.params == {"tile_x": 2, "local_size": (8, 1, 1)} and got.best_us == 50.0 and got.speedup == 2.0
    assert (tmp_path / "t.json").stat().st_mode & 0o777 == 0o600
    # a record measured with another version of its generator (the version derives from the generator's source)
    assert rec.generator_version == generator_version("CONV_2D") and rec.current
    stale = TuningRecord({"tile_x": 8}, 100.0, 40.0, 50, "CONV_2D", generator_version=generator_version("CONV_2D") - 1)
    FileTuningDB(tmp_path / "s.json").put("dev", "k1", stale)
    assert FileTuningDB(tmp_path / "s.json").get("dev", "k1") is None  # a changed generator: not used
    db2 = FileTuningDB(tmp_path / "s.json")
    db2.put("dev", "k1", TuningRecord({"tile_x": 4}, 100.0, 90.0, 1, "CONV_2D"))  # replaced despite fewer trials
    assert FileTuningDB(tmp_path / "s.json").get("dev", "k1").params == {"tile_x": 4}


def test_corrupt_records_are_set_aside(tmp_path, caplog):
    path = tmp_path / "t.json"
    path.write_text('{"format": 1, "records": {"dev": {"k": {"params": 5')
    db = FileTuningDB(path)
    assert db.get("dev", "k") is None
    assert "unreadable" in caplog.text and (tmp_path / "t.json.corrupt").exists()
    db.put("dev", "k", TuningRecord({}, 1.0, 1.0))
    assert json.loads(path.read_text())["records"]["dev"]["k"]["params"] == {}


def invoke(it, feeds):
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_tuned_model_matches_litert_and_records_are_reused(opencl_device, rng, tmp_path):
    model, feeds = conv_model(rng)
    ref = run_model(litert(), model, feeds)[0]
    db = tmp_path / "records.json"
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning="fast", tuning_db=db, tuning_budget_s=20))
    plan = it.gpu_plan
    assert [k.source for k in plan.tuning_results] == ["tuned"]
    assert_close(invoke(it, feeds), ref)
    it2 = Interpreter(model_content=model, delegate=GpuDelegate(tuning="fast", tuning_db=db))
    assert [k.source for k in it2.gpu_plan.tuning_results] == ["record"] and it2.gpu_plan.tuning_seconds == 0
    assert it2.gpu_plan.steps[0].params == plan.tuning_results[0].params
    assert_close(invoke(it2, feeds), ref)


@pytest.mark.parametrize("params", [{"winograd": True}, {"tile_x": 1, "tile_s": 1, "lanes": 4, "vec_hint": "float4"},
                                    {"tile_x": 8, "tile_s": 2, "lanes": 4, "vec_hint": "float4", "strided": True,
                                     "const_weights": True}])
def test_recorded_parameters_are_applied(opencl_device, rng, params):
    """Whatever the record says is what runs, and it still matches LiteRT."""
    from tflgpu.autotune import kernel_key

    model, feeds = interior_conv_model(rng)
    plain = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=False)).gpu_plan
    step = plain.steps[1]
    assert step.op.name == "CONV_2D"
    from tflgpu.kernels.program import shared_base

    key = kernel_key(step.op.name, step.specs, False, shared_base(step.specs))
    db = MemoryTuningDB()
    db.put(opencl_device.identity.key(), key, TuningRecord(params, 10.0, 5.0, 3, "CONV_2D"))
    it = Interpreter(model_content=model, delegate=GpuDelegate(tuning_db=db))
    assert it.gpu_plan.steps[1].params == params
    assert_close(invoke(it, feeds), run_model(litert(), model, feeds)[0])


def test_tuning_option_validation():
    with pytest.raises(ValueError, match="tuning must be one of"):
        GpuDelegate(tuning="fastest")
    with pytest.raises(ValueError, match="tuning_budget_s"):
        GpuDelegate(tuning="fast", tuning_budget_s=0)
    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(ValueError, match="tuning_trials must be a positive int"):
            GpuDelegate(tuning="fast", tuning_trials=bad)
    assert GpuDelegate(tuning="fast", tuning_trials=3).tuning_config(None).kernel_trials() == 3


def test_workers_share_one_search(opencl_device, rng, tmp_path):
    """Three `tflgpu tune` processes on one SQLite storage: all succeed, the study holds trials measured
    by more than one of them, and the record is the decision drawn from the whole study."""
    import optuna

    model, _ = conv_model(rng)
    path = tmp_path / "conv.tflite"
    path.write_bytes(model)
    storage = f"sqlite:///{tmp_path / 'trials.db'}"
    db = tmp_path / "records.json"
    cmd = [sys.executable, "-m", "tflgpu.cli", "tune", str(path), "--mode", "fast", "--trials", "3",
           "--storage", storage, "--db", str(db), "--repeat", "3", "-q"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        assert "searching took" in out
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len({t.user_attrs["worker"] for t in finished}) >= 2
    ((_, key, rec),) = list(FileTuningDB(db).items())
    assert key in summary.study_name and rec.trials == len(complete)
    if rec.params:  # chosen: the study's best trial
        assert {k: repr(v) for k, v in rec.params.items()} == study.best_params


def test_tune_cli_prints_the_table(rng, tmp_path, opencl_device):
    model, _ = conv_model(rng)
    path = tmp_path / "conv.tflite"
    path.write_bytes(model)
    r = subprocess.run([sys.executable, "-m", "tflgpu.cli", "tune", str(path), "--mode", "fast", "--trials", "2",
                        "--repeat", "30", "-q", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "start us" in r.stdout and "conv_2d" in r.stdout
    doc = json.loads(r.stdout[r.stdout.index("["):])
    assert doc[0]["model"] == "conv.tflite" and doc[0]["kernels"][0]["op"] == "CONV_2D"
    assert np.isfinite(doc[0]["heuristic_ms"]) and np.isfinite(doc[0]["tuned_ms"])
    # what `tflgpu tune` recorded is what a later Interpreter on this device uses, without searching: the search's
    # parameters, or the heuristic default where the model was slower with them end to end (the row says which)
    # (the search's start: the shipped database's record for this device where it has one, else the heuristics; a
    # search that keeps its start records and reports the start's parameters)
    start = Interpreter(model_path=str(path), delegate=GpuDelegate(tuning="none", tuning_db=MemoryTuningDB(),
                                                                   cache=False)).gpu_plan.tuning_results
    it = Interpreter(model_path=str(path), delegate=GpuDelegate(tuning="fast"))
    assert [k.source for k in it.gpu_plan.tuning_results] == ["record"] and it.gpu_plan.tuning_seconds == 0
    row = doc[0]["kernels"][0]
    assert row["used"] == ("NOT stored" not in doc[0]["verdict"]), doc[0]["verdict"]
    expected = row["params"] if row["used"] else (start[0].params if start else {})
    assert json.loads(json.dumps(it.gpu_plan.tuning_results[0].params)) == json.loads(json.dumps(expected))


@pytest.mark.parametrize("timings,stored", [([(1.0, 1.2), (1.0, 1.0)], True), ([(1.0, 1.2), (1.0, 1.1)], False)])
def test_one_slow_end_to_end_timing_does_not_throw_a_search_away(rng, tmp_path, opencl_device, monkeypatch,
                                                                   timings, stored):
    """`tflgpu tune` keeps its records only if the model is not slower with them end to end. A first timing
    that says "slower" is taken again, for longer (``CONFIRM_S``), and the second decides: a burst of another
    process during the first (what failed CI once, on a fleet machine) no longer discards the search."""
    from tflgpu import tuning_report as report
    from tflgpu.autotune import tuner

    monkeypatch.setattr(tuner, "MIN_GAIN", -1.0)  # (any candidate is chosen: the end-to-end check is what is tested)
    calls = []

    def scripted(interps, rounds=30, min_seconds=0.0, **kw):
        calls.append(min_seconds)
        return list(timings[len(calls) - 1])

    monkeypatch.setattr(report, "interleaved_ms", scripted)
    path = tmp_path / "conv.tflite"
    path.write_bytes(conv_model(rng)[0])
    db = FileTuningDB(tmp_path / "records.json")
    t = report.tune_model(path, mode="fast", trials=2, db=db, rounds=3)
    assert calls == [0.0, report.CONFIRM_S]
    ((_, _, rec),) = list(db.items())
    if stored:
        assert t.verdict.startswith("stored 1 records (1 with tuned") and rec.params, t.verdict
        assert (t.heuristic_ms, t.tuned_ms) == timings[1]
    else:
        assert t.verdict.startswith("NOT stored") and "1.10 ms vs 1.00 ms" in t.verdict and not rec.params, t.verdict
        assert t.kernels[0].search.endswith("(not used)") and not t.kernels[0].used


@pytest.mark.parametrize("cin,kept", [(16, True), (256, False)])
def test_fp16_arithmetic_is_kept_only_where_its_sums_are_short(opencl_device, rng, monkeypatch, cin, kept):
    """A candidate doing its arithmetic in half (``half_math``) is held to the FP16 budget's share of one kernel
    (measure.CHECK_BOUND), not to FP16 storage's looser bound: a 3x3 conv's 144 half terms pass, 2,304 do not
    (their outputs move by about 1%)."""
    import tflgpu.runtime.tuning as rt
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.autotune.measure import CHECK_BOUND, CandidateRejected, check_outputs

    from .oputil import In, op_model

    if not opencl_device.identity.fp16:
        pytest.skip("device has no cl_khr_fp16")
    tasks = []
    monkeypatch.setattr(rt, "tune_tasks", lambda found, bench_for, key, config: tasks.extend(
        (t, bench_for(t)) for t in found) or [])
    w = rng.uniform(-1, 1, (16, 3, 3, cin)).astype(np.float32) / np.float32(np.sqrt(9 * cin))
    model, _ = op_model("CONV_2D", [In(rng.uniform(-1, 1, (1, 8, 8, cin)).astype(np.float32)), w,
                                    rng.uniform(-1, 1, 16).astype(np.float32)], padding="SAME", stride_w=1, stride_h=1)
    Interpreter(model_content=model, delegate=GpuDelegate(precision_loss_allowed=True, tuning="exhaustive",
                                                          cache=False)).allocate_tensors()
    ((task, bench),) = tasks
    ref = bench.time(task.make({})).outputs
    half = task.make({"half_math": True, "tile_x": 2, "tile_s": 2, "lanes": 4, "vec_hint": None, "group_tile": None})
    assert CHECK_BOUND["half_math"] < CHECK_BOUND["fp16"]
    if kept:
        bench.time(half, ref=ref)
    else:
        with pytest.raises(CandidateRejected, match="differs from the default"):
            bench.time(half, ref=ref)
        check_outputs(bench.read_outputs(), ref, fp16=True)  # (within FP16 storage's bound: only half math is held)
