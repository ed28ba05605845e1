"""Reliability of the delegated path: device errors at run time, concurrent use, resize cycles, long runs.

The long runs are marked ``slow`` (``pytest -m slow``); the rest run in CI."""

from __future__ import annotations

import gc
import os
import threading
import weakref

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.benchmark import reference_inputs
from tflgpu.cache.store import CacheStore
from tflgpu.model.default_model import DEFAULT_MODEL_PATH

from .conftest import assert_close, litert, run_model

MODEL = str(DEFAULT_MODEL_PATH)


@pytest.fixture(scope="module")
def feeds():
    return reference_inputs(Interpreter(MODEL).get_input_details())


@pytest.fixture(scope="module")
def want(feeds):
    return run_model(litert(), MODEL, feeds)[0]


@pytest.fixture
def device_buffers(monkeypatch):
    """Counts the OpenCL buffers actually alive (not the planner's figure): every pyopencl Buffer made while
    the test runs is tracked; the fixture returns a function giving (count, bytes) of those still alive."""
    from tflgpu.runtime.device import import_pyopencl

    cl = import_pyopencl()
    live = weakref.WeakSet()

    class Counted(cl.Buffer):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            live.add(self)

    monkeypatch.setattr(cl, "Buffer", Counted)

    def alive() -> tuple[int, int]:
        gc.collect()
        return len(live), sum(b.size for b in live)

    return alive


def invoke(it, feeds):
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_device_error_during_invoke(opencl_device, tmp_path, feeds, want):
    """An OpenCL error while running (out of resources, lost device: injected) is a RuntimeError; the
    Interpreter refuses to run on the suspect plan until allocate_tensors() rebuilds it; the cache is intact."""
    import pyopencl as cl

    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none"))
    it.allocate_tensors()
    assert_close(invoke(it, feeds), want)

    class Failing:
        def __getattr__(self, name):
            return getattr(cl, name)

        def enqueue_nd_range_kernel(self, *a, **k):
            raise cl.RuntimeError("clEnqueueNDRangeKernel failed: OUT_OF_RESOURCES (injected)")

    it.gpu_plan.cl = Failing()
    with pytest.raises(RuntimeError, match="OpenCL device error during invoke"):
        invoke(it, feeds)
    with pytest.raises(RuntimeError, match="allocate_tensors"):
        invoke(it, feeds)  # not silently run on the suspect plan
    it.allocate_tensors()  # rebuilds the plan (from the cache)
    assert it.gpu_plan.build_stats["plan"] == "cache"
    assert_close(invoke(it, feeds), want)
    assert all(e.problem is None for e in CacheStore(tmp_path).entries())


def test_concurrent_invoke_on_one_interpreter_is_refused(opencl_device, feeds, monkeypatch):
    it = Interpreter(MODEL, delegate=GpuDelegate(tuning="none"))
    it.allocate_tensors()
    want = invoke(it, feeds)
    inside, release = threading.Event(), threading.Event()
    run = it.gpu_plan.run

    def held_run(inputs):  # another thread's invoke, held inside the plan until the check is done
        inside.set()
        release.wait(30)
        return run(inputs)

    monkeypatch.setattr(it.gpu_plan, "run", held_run)
    other = threading.Thread(target=it.invoke)
    other.start()
    try:
        assert inside.wait(30)
        with pytest.raises(RuntimeError, match="not thread-safe: use one per thread"):
            it.invoke()
    finally:
        release.set()
        other.join(30)
    monkeypatch.undo()
    assert_close(invoke(it, feeds), want)


@pytest.mark.parametrize("threads,invokes", [pytest.param(8, 20, id="ci"),
                                             pytest.param(8, 200, id="long", marks=pytest.mark.slow)])
def test_one_interpreter_per_thread(opencl_device, feeds, threads, invokes):
    single = Interpreter(MODEL, delegate=GpuDelegate(tuning="none"))
    single.allocate_tensors()
    expect = invoke(single, feeds).copy()
    results, errors = [None] * threads, []

    def work(k):
        try:
            it = Interpreter(MODEL, delegate=GpuDelegate(tuning="none"))
            it.allocate_tensors()
            outs = [invoke(it, feeds).copy() for _ in range(invokes)]
            results[k] = all(np.array_equal(o, expect) for o in outs)
        except Exception as e:  # reported below, with the thread
            errors.append((k, repr(e)))

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    assert not errors and all(results), (errors, results)


def test_resize_cycles_are_correct_and_release_device_buffers(opencl_device, rng, device_buffers):
    """Resizes back and forth: each result matches LiteRT, and the device buffers alive after each rebuild are
    exactly those of one plan for that shape (an earlier plan's are freed, not only its Python object); an
    interpreter deleted leaves none behind."""
    before = device_buffers()
    it = Interpreter(MODEL, delegate=GpuDelegate(tuning="none", cache=False))
    idx = it.get_input_details()[0]["index"]
    base = tuple(int(s) for s in it.get_input_details()[0]["shape"])
    ref = litert()(model_path=MODEL)
    old, alive = [], {}
    for batch in (1, 4, 1, 4, 2):
        shape = (batch,) + base[1:]
        it.resize_tensor_input(idx, shape)
        it.allocate_tensors()
        old.append(weakref.ref(it.gpu_plan))
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        ref.resize_tensor_input(idx, shape)
        ref.allocate_tensors()
        ref.set_tensor(idx, x)
        ref.invoke()
        assert_close(invoke(it, [x]), ref.get_tensor(ref.get_output_details()[0]["index"]))
        now = device_buffers()
        assert alive.setdefault(batch, now) == now, f"batch {batch}: {now} buffers/bytes alive, first time {alive[batch]}"
    assert alive[4][1] > alive[1][1] > before[1]  # (the counts see the plans' buffers)
    gc.collect()
    assert sum(r() is not None for r in old) == 1  # every earlier plan is gone
    del it
    assert device_buffers() == before


class _LoggingProgram:
    """pyopencl's Program as its build ends where the compiler wrote a log: ``pyopencl.compiler_output`` (looked up
    at the call, as pyopencl does) gets the log; ``hold`` (an event) is waited for first, ``building`` set."""

    def __init__(self, ctx, src, building=None, hold=None):
        self.src, self.building, self.hold = src, building, hold

    def build(self, options, **kw):
        import pyopencl

        if self.building is not None:
            self.building.set()
        if self.hold is not None:
            assert self.hold.wait(10)
        pyopencl.compiler_output("Compilation started\nCompilation done")
        return self

    def get_info(self, what):
        return [b"binary of " + self.src.encode()]


def test_builds_in_two_threads_pass_no_compiler_warning_on(monkeypatch):
    """A build's compiler log (the Intel compiler always writes one) never reaches the process as pyopencl's
    CompilerWarning, with builds in several threads (a plan's optimized build on its worker while the next plan
    builds). Here a process that turns warnings into errors builds in two threads, the first build held until the
    second has started."""
    import functools
    import types
    import warnings

    import pyopencl as cl

    from tflgpu.kernels import program

    first_building, release = threading.Event(), threading.Event()
    programs = {"first": functools.partial(_LoggingProgram, building=first_building, hold=release)}
    fake_cl = types.SimpleNamespace(Program=lambda ctx, src: programs.get(src, _LoggingProgram)(ctx, src),
                                    program_info=cl.program_info, Error=cl.Error, CompilerWarning=cl.CompilerWarning)
    ctx = types.SimpleNamespace(devices=[types.SimpleNamespace(int_ptr=-1)])
    monkeypatch.setattr(program, "COMPILED", program.CompiledBinaries())
    monkeypatch.setattr(cl, "compiler_output", cl.compiler_output)  # (restored after the test)
    failures = []

    def compile_one(src):
        try:
            program._compile(fake_cl, ctx, src, ["-cl-mad-enable"], src)
        except cl.CompilerWarning as e:  # (raised: the process turns warnings into errors)
            failures.append((src, e))

    with warnings.catch_warnings():
        warnings.simplefilter("error", cl.CompilerWarning)
        first = threading.Thread(target=compile_one, args=("first",))
        first.start()
        assert first_building.wait(10)
        second = threading.Thread(target=compile_one, args=("second",))
        second.start()
        release.set()
        first.join()
        second.join()
    assert failures == []
    assert program.COMPILED.get(-1, "second") == b"binary of second"


def test_a_build_neither_warns_nor_touches_the_warning_filters_of_other_threads(monkeypatch):
    """The build's filter was set with ``warnings.catch_warnings``, which swaps the process's filter list and is not
    thread-safe. A user thread that entered its own ``catch_warnings`` before a build on a plan's worker began and
    left it while that build ran restored the list it had saved: the build's filter was gone and its compiler log
    reached the user as a CompilerWarning (the valid-model fuzzer printed it: its main thread wraps LiteRT's
    construction so). And the build's own exit put back the list it had saved, undoing what the user's thread had
    done meanwhile. Now a build leaves the filters alone, and a user's own pyopencl build still warns."""
    import types
    import warnings

    import pyopencl as cl

    from tflgpu.kernels import program

    monkeypatch.setattr(cl, "compiler_output", cl.compiler_output)  # (restored after the test)
    building, release = threading.Event(), threading.Event()
    ctx = types.SimpleNamespace(devices=[types.SimpleNamespace(int_ptr=-1)])
    failures = []

    def worker_build():  # (a plan's optimized build on its worker)
        try:
            program.build(_LoggingProgram(ctx, "worker", building, release), ["-cl-mad-enable"])
        except cl.CompilerWarning as e:
            failures.append(e)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error", cl.CompilerWarning)  # (the process: warnings are errors)
        own = threading.Thread(target=worker_build)
        with warnings.catch_warnings():  # the user's thread, around something of its own
            warnings.simplefilter("ignore", DeprecationWarning)
            own.start()
            assert building.wait(10)
        user_filters = list(warnings.filters)  # (the user's, set while the build runs)
        release.set()
        own.join()
        assert warnings.filters == user_filters  # the build's end left them as they were
        assert failures == []
        warnings.simplefilter("always", cl.CompilerWarning)
        cl.compiler_output("the user's own build said so")  # (pyopencl, after a build of the user's)
    assert [str(w.message) for w in caught if w.category is cl.CompilerWarning] == [
        "Non-empty compiler output encountered. Set the environment variable PYOPENCL_COMPILER_OUTPUT=1 to see more."]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("invokes", [pytest.param(1_000, id="ci"), pytest.param(10_000, id="long", marks=pytest.mark.slow)])
def test_long_run_memory_is_flat(opencl_device, tmp_path, feeds, want, invokes, device_buffers):
    """Many invokes: host RSS flat after warm-up, the device buffers alive unchanged (counted, not the
    planner's figure), the cache unchanged, the result still LiteRT's."""
    it = Interpreter(MODEL, delegate=GpuDelegate(serialization_dir=tmp_path, tuning="none"))
    it.allocate_tensors()
    for _ in range(200):
        invoke(it, feeds)
    gc.collect()
    rss0, cache0, buffers0 = _rss_bytes(), CacheStore(tmp_path).total_bytes(), device_buffers()
    assert buffers0[0] > 0
    for _ in range(invokes):
        y = invoke(it, feeds)
    gc.collect()
    grown = _rss_bytes() - rss0
    print(f"\n{invokes:,} invokes: RSS {rss0 / 2**20:.1f} MiB -> {(rss0 + grown) / 2**20:.1f} MiB")
    assert grown < 8 * 2**20, grown
    assert device_buffers() == buffers0 and CacheStore(tmp_path).total_bytes() == cache0
    assert_close(y, want)


CHILD = r"""
import sys, numpy as np
from tflgpu import GpuDelegate, Interpreter
from tflgpu.benchmark import reference_inputs
model, cache, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
it = Interpreter(model, delegate=GpuDelegate(serialization_dir=cache, tuning="none"))
it.allocate_tensors()
x = reference_inputs(it.get_input_details())
first = None
for _ in range(n):
    it.set_tensor(it.get_input_details()[0]["index"], x[0])
    it.invoke()
    y = it.get_tensor(it.get_output_details()[0]["index"])
    assert first is None or np.array_equal(y, first), "outputs changed between invokes"
    first = y.copy() if first is None else first
np.save(out, first)
"""


@pytest.mark.parametrize("invokes", [pytest.param(50, id="ci"), pytest.param(200, id="long", marks=pytest.mark.slow)])
def test_processes_sharing_one_cache(opencl_device, tmp_path, want, invokes):
    """4 processes on one fresh cache directory (building and writing it at the same time), each running the
    model repeatedly: every output equals the single-threaded run's, and the cache verifies clean."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    env = {**os.environ, "TFLGPU_TUNING": ""}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, MODEL, str(cache), str(invokes), str(tmp_path / f"{k}.npy")],
                              stderr=subprocess.PIPE, text=True, env=env) for k in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    single = Interpreter(MODEL, delegate=GpuDelegate(tuning="none", cache=False))
    single.allocate_tensors()
    expect = invoke(single, reference_inputs(single.get_input_details()))
    outs = [np.load(tmp_path / f"{k}.npy") for k in range(4)]
    for o in outs:
        np.testing.assert_array_equal(o, expect)
        assert_close(o, want)
    assert all(e.problem is None for e in CacheStore(cache).entries())


FORK_CHILD = """
import os, sys, time
import numpy as np
from tflgpu import GpuDelegate, Interpreter
from tflgpu.benchmark import reference_inputs

model, out_dir, delegated = sys.argv[1], sys.argv[2], sys.argv[3] == "1"


def make(delegate):
    it = Interpreter(model, delegate=GpuDelegate(cache=False) if delegate else None)
    it.allocate_tensors()
    return it


def run(it):
    for d, x in zip(it.get_input_details(), reference_inputs(it.get_input_details())):
        it.set_tensor(d["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def attempt(name, f):
    try:
        np.save(os.path.join(out_dir, name + ".npy"), f())
        print(name, "ran", flush=True)
    except Exception as e:
        print(name, "raised", type(e).__name__, str(e).replace(chr(10), " "), flush=True)


parent = make(delegated)
np.save(os.path.join(out_dir, "parent.npy"), run(parent))
if not delegated:
    import numba
    print("layer", numba.threading_layer(), flush=True)
pid = os.fork()
if pid == 0:
    attempt("child_same", lambda: run(parent))
    attempt("child_new", lambda: run(make(delegated)))
    attempt("child_cpu", lambda: run(make(False)))
    os._exit(0)
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child status", status, flush=True)
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    print("child hung", flush=True)
np.save(os.path.join(out_dir, "parent_after.npy"), run(parent))
"""


def fork_run(tmp_path, delegated: bool, **env) -> dict[str, str]:
    """FORK_CHILD in a fresh process (not a fork of this one): each line it printed, by its first word."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", FORK_CHILD, MODEL, str(tmp_path), "1" if delegated else "0"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, **env}, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in p.stdout.splitlines() if " " in line}


def test_forked_child_runs_the_cpu_kernels(tmp_path, want):
    """A child forked after the parent ran the model on the CPU kernels (multiprocessing's default start on
    Linux, a server's pre-forked workers) runs it, with the parent's interpreter and with a new one, as LiteRT's
    does. numba's default threading layer here was GNU OpenMP, which ended such a child (SIGTERM) at its first
    kernel; TBB's, which tflgpu makes loadable from the tbb wheel, survives fork."""
    said = fork_run(tmp_path, delegated=False)
    assert said["child"] == "status 0", said
    for name in ("parent", "child_same", "child_new", "child_cpu", "parent_after"):
        assert said.get(name, "ran") == "ran", said
        assert_close(np.load(tmp_path / f"{name}.npy"), want)


def test_forked_child_after_gnu_openmp_is_told_what_to_change(tmp_path):
    """Where the process chose numba's OpenMP layer (NUMBA_THREADING_LAYER=omp) and it is GNU's, a forked child
    gets a RuntimeError naming what to change, not a SIGTERM at its first kernel."""
    said = fork_run(tmp_path, delegated=False, NUMBA_THREADING_LAYER="omp")
    if said.get("layer") != "omp":
        pytest.skip(f"numba has no OpenMP layer here ({said.get('layer')})")
    assert said["child"] == "status 0", said
    for name in ("child_same", "child_new", "child_cpu"):
        assert said[name].startswith("raised RuntimeError tflgpu's CPU kernels ran on numba's GNU OpenMP"), said
        assert "'spawn'" in said[name] and "pip install tbb" in said[name]
    assert (tmp_path / "parent_after.npy").exists()


def test_forked_child_refuses_the_parents_opencl(opencl_device, tmp_path, want):
    """In a child forked after the parent opened OpenCL, the parent's delegated interpreter and a new one raise a
    ForkedProcessError naming what to change (on PoCL both waited forever; NVIDIA's driver does not work in
    such a child either); the CPU kernels still run there, and the parent's interpreter is unharmed."""
    said = fork_run(tmp_path, delegated=True)
    assert said["child"] == "status 0", said
    for name in ("child_same", "child_new"):
        assert said[name].startswith("raised ForkedProcessError OpenCL was opened in process"), said
        assert "'spawn'" in said[name]
    assert said["child_cpu"] == "ran"
    for name in ("parent", "child_cpu", "parent_after"):
        assert_close(np.load(tmp_path / f"{name}.npy"), want)


NUMBA_CACHE_BROKEN = """
import errno, logging, sys
import numpy as np
import numba.core.caching as caching

how, model, out = sys.argv[1:4]


def refuse(*args, **kw):
    raise OSError(errno.ENOSPC, "No space left on device")


if how == "full":  # every write of numba's cache fails, as on a full disk
    caching.IndexDataCacheFile.save = refuse
else:  # no directory numba looks in is writable (site-packages, the home directory, NUMBA_CACHE_DIR)
    caching._CacheLocator.ensure_cache_path = refuse
said = []


class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())


logging.getLogger("tflgpu").addHandler(Keep(logging.WARNING))
from tflgpu import Interpreter
from tflgpu.benchmark import reference_inputs

it = Interpreter(model)
it.allocate_tensors()
for d, x in zip(it.get_input_details(), reference_inputs(it.get_input_details())):
    it.set_tensor(d["index"], x)
it.invoke()
np.save(out, it.get_tensor(it.get_output_details()[0]["index"]))
print(len(said), said[0] if said else "")
"""


@pytest.mark.parametrize("how", ["full", "no_directory"])
def test_the_cpu_kernels_run_where_numbas_cache_cannot_be_written(tmp_path, how):
    """Where numba cannot write its cache of the CPU kernels' machine code (a full disk; no writable directory of
    the ones it looks in: a read-only image), the kernels compile and run from memory, said once. Before, numba's
    OSError ("No space left on device") came out of the compile inside invoke(), and a missing directory was a
    RuntimeError ("cannot cache function ... no locator available") at the first kernel. In a fresh process with
    an empty NUMBA_CACHE_DIR, so that every kernel compiles; the model's quantize and dequantize kernels, its
    quantized ufunc and its float kernels are all cached ones."""
    import subprocess
    import sys

    from .conftest import corpus_model

    model = corpus_model("fallback_ops.tflite")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "TFLGPU_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", NUMBA_CACHE_BROKEN, how, str(model), str(tmp_path / "out.npy")],
                       capture_output=True, text=True, timeout=600, env=env, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    count, message = p.stdout.strip().split(" ", 1)
    assert count == "1" and "numba cannot keep the CPU kernels' machine code on disk" in message, p.stdout
    assert "NUMBA_CACHE_DIR" in message
    assert_close(np.load(tmp_path / "out.npy"), run_model(litert(), model, reference_inputs(
        Interpreter(str(model)).get_input_details()))[0])
