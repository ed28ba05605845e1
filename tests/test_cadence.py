"""An invoke's flush cadence (runtime.cadence): where it flushes, how a plan's trial settles, and that every
cadence computes LiteRT's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.model.default_model import DEFAULT_MODEL_PATH, INPUT_SHAPE
from tflgpu.runtime.cadence import CANDIDATES, DIRECT, MIN_LAUNCHES, NEVER, Cadence, CadenceTrial

from .conftest import assert_close, counted_calls, litert, run_model


def test_flush_positions():
    assert NEVER.flushes(30) == frozenset()
    assert Cadence(first=True).flushes(30) == {1}
    assert Cadence(first=True, every=8).flushes(30) == {1, 8, 16, 24}
    assert Cadence(every=8).flushes(16) == {8}  # (never after the last launch: the final wait submits it)
    assert Cadence(first=True, every=2).flushes(5) == {1, 2, 4}
    assert Cadence(first=True).flushes(1) == frozenset()


def _settle(trial: CadenceTrial, cost) -> list[Cadence]:
    """Run the trial with each invoke taking ``cost(cadence, i)`` seconds until it chooses; the cadences asked."""
    asked = []
    while trial.chosen is None:
        c = trial.next()
        asked.append(c)
        trial.record(c, cost(c, len(asked)))
        assert len(asked) <= trial.warmup + trial.rounds * len(trial.candidates)
    return asked


def test_the_trial_interleaves_the_candidates_and_keeps_a_clear_winner():
    fast = Cadence(first=True, every=8)
    trial = CadenceTrial(30)
    asked = _settle(trial, lambda c, i: 1e-3 * (0.8 if c == fast else 1.0) * (1 + 0.01 * (i % 3)))
    n = len(CANDIDATES)
    # the warm-up at the baseline, then in turn, each round one candidate later (drift and order hit all alike)
    assert asked == [NEVER] * trial.warmup + [CANDIDATES[(i + r) % n] for r in range(trial.rounds) for i in range(n)]
    assert trial.chosen == fast and trial.next() == fast
    assert all(len(t) == trial.rounds for t in trial.times.values()) and len(trial.times) == n
    trial.record(NEVER, 1e-9)  # (ignored once chosen)
    assert trial.chosen == fast


def test_the_trial_keeps_no_flush_unless_a_cadence_beats_it_by_the_margin():
    trial = CadenceTrial(30)
    _settle(trial, lambda c, i: 1e-3 * (0.97 if c != NEVER else 1.0))  # 3%: within the 5% margin
    assert trial.chosen == NEVER
    slow = CadenceTrial(30)
    _settle(slow, lambda c, i: 1e-3 * (1.0 if c == NEVER else 1.5))
    assert slow.chosen == NEVER


def test_neither_the_warm_up_nor_one_outlier_per_candidate_decides():
    """The first invokes (slower whatever the cadence) are not timed, and medians keep a single slow invoke
    (another process's burst) from moving the choice."""
    fast = Cadence(first=True)
    trial = CadenceTrial(30)
    seen = set()

    def cost(c, i):
        if i <= trial.warmup:
            return 1.0  # (the baseline's warm-up: ignored, or it would lose to anything)
        first = c not in seen
        seen.add(c)
        return 1.0 if first and c == fast else (0.8e-3 if c == fast else 1e-3)

    _settle(trial, cost)
    assert trial.chosen == fast and max(max(t) for c, t in trial.times.items() if c != fast) < 1.0


def test_a_plan_of_few_launches_or_one_candidate_never_flushes():
    assert CadenceTrial(MIN_LAUNCHES - 1).chosen == NEVER and CadenceTrial(30, (NEVER,)).chosen == NEVER
    assert CadenceTrial(MIN_LAUNCHES - 1).next() == NEVER
    trial = CadenceTrial(30)
    _settle(trial, lambda c, i: 1e-3 * (0.5 if c == Cadence(first=True, every=2) else 1.0))
    assert trial.chosen == Cadence(first=True, every=2)


@pytest.fixture(scope="module")
def reference():
    feed = np.random.default_rng(3).uniform(-1, 1, INPUT_SHAPE).astype(np.float32)
    return feed, run_model(litert(), Path(DEFAULT_MODEL_PATH).read_bytes(), [feed])[0]


def test_a_plan_flushes_where_its_cadence_says_and_computes_litert_values_under_each(opencl_device, tmp_path,
                                                                                      reference):
    """Through the trial's invokes, each flushes its queue after the launches its cadence names (counted on the
    plan's queue) and launches through pyopencl or with no event each (``direct``) as it says, every output is
    LiteRT's, and the plan then keeps one cadence; new kernels installed by a swap start the trial again (and drop
    the direct launches' arguments)."""
    from tflgpu.runtime.upgrades import retune_steps

    feed, want = reference
    it = Interpreter(str(DEFAULT_MODEL_PATH), delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none",
                                                                   tiered_compile=False))
    it.allocate_tensors()
    plan = it.gpu_plan
    n = plan.launch_count()
    every = CANDIDATES + DIRECT
    gpu = plan.cadences == every  # (a CPU device never flushes, nor launches directly: measured on a GPU)
    assert n >= MIN_LAUNCHES and (plan.cadence.chosen is None if gpu else plan.cadence.chosen == NEVER)
    assert plan.launch is not None
    plan.cadences = every
    plan.cadence = CadenceTrial(n, every)

    flushed, real_cl, real_flush, real_launch = [], plan.cl, plan.flush, plan.launch
    launched = counted_calls(plan, "enqueue_nd_range_kernel")  # (the plan's kernel launches, as they are enqueued)
    direct, forgotten = [], []

    class Launches:  # (the direct launches, counted)
        def __call__(self, kernel, gsize, lsize):
            direct.append(kernel)
            real_launch(kernel, gsize, lsize)

        def forget(self):
            forgotten.append(True)
            real_launch.forget()

    def flush():
        flushed.append(len(launched) + len(direct))
        real_flush()

    plan.flush, plan.launch = flush, Launches()
    x, y = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    for _ in range(plan.cadence.warmup + plan.cadence.rounds * len(plan.cadence.candidates)):
        cadence = plan.cadence.next()
        flushed.clear()
        launched.clear()
        direct.clear()
        it.set_tensor(x, feed)
        it.invoke()
        assert (len(direct), len(launched)) == ((n, 0) if cadence.direct else (0, n)), cadence
        assert sorted(flushed) == sorted(cadence.flushes(n)), cadence
        assert_close(it.get_tensor(y), want)
    assert plan.cadence.chosen in every and any(c.direct for c in plan.cadence.times)
    plan.cl, plan.flush = real_cl, real_flush
    conv = next(s for s in plan.steps if s.op.name == "CONV_2D" and s.device == "gpu" and s.specs[0].space)
    params = {**conv.specs[0].params, "tile_s": 2, "lanes": 4, "vec_hint": "float4"}
    retune_steps(plan, [conv.op.index], params, "CONV_2D")
    it.set_tensor(x, feed)
    it.invoke()
    assert_close(it.get_tensor(y), want)
    assert plan.cadence.chosen is None and plan.cadence.candidates == every and plan.cadence._turn == 1
    assert forgotten


def test_a_gpu_plan_tries_the_cadences_and_a_cpu_plan_never_flushes(opencl_device, monkeypatch, tmp_path):
    from tflgpu.kernels.base import Target

    if opencl_device.identity.device_type == "GPU":
        pytest.skip("a CPU OpenCL device's plan: this one is a GPU")
    cpu = Interpreter(str(DEFAULT_MODEL_PATH), delegate=GpuDelegate(serialization_dir=tmp_path / "cpu",
                                                                    tuning="none", tiered_compile=False))
    assert cpu.gpu_plan.cadence.chosen == NEVER and cpu.gpu_plan.cadence.next() == NEVER
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True)))
    gpu = Interpreter(str(DEFAULT_MODEL_PATH), delegate=GpuDelegate(serialization_dir=tmp_path / "gpu",
                                                                    tuning="none", tiered_compile=False))
    assert gpu.gpu_plan.cadence.chosen is None and gpu.gpu_plan.cadence.candidates == CANDIDATES + DIRECT


def test_a_benchmark_warms_a_plan_up_until_its_cadence_is_chosen(opencl_device, tmp_path, reference):
    """Timed invokes come after the trial (tflgpu.benchmark.warm_up): they would mix cadences otherwise."""
    from tflgpu.benchmark import settling, time_invokes

    feed, want = reference
    it = Interpreter(str(DEFAULT_MODEL_PATH), delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none",
                                                                   tiered_compile=False))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], feed)
    it.gpu_plan.cadence = CadenceTrial(it.gpu_plan.launch_count())  # (as a GPU's plan would have it)
    assert settling(it)
    times = time_invokes(it, warmup=1, repeats=3)
    assert len(times) == 3 and not settling(it) and it.gpu_plan.cadence.chosen in CANDIDATES
    assert_close(it.get_tensor(it.get_output_details()[0]["index"]), want)
