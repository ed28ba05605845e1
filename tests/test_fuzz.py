"""Fuzzed models: mutants of real corpus models and of a small int8 model (bit flips, extreme integers written over fields, so giant
or negative sizes and out-of-range indices, splices, truncations) either load and run or are refused with a
ValueError/RuntimeError that is a verdict, not a wrapped bug — never a crash, a hang, an unbounded allocation,
another exception type, or a refusal whose cause chain holds an internal error (IndexError, KeyError, ...).

A mutant still running after 60 s is timed on LiteRT (in a process of its own): when LiteRT takes over a
second too (a mutant with an 800 MB input does real work), ours may take 25 times as long before it counts
as a hang; such mutants are listed as slow. A third of the mutants go through GpuDelegate (the quantized model's too), and the test asserts how many
reached a device plan. The mutants run in a child process (a segfault would otherwise take pytest down)
under an address-space limit and a per-mutant alarm, measuring line coverage (coverage.py) of what they
reach. CI runs a fixed seed's first 240 mutants; TFLGPU_FUZZ_SECONDS=600 runs for that long instead (run
with -s to see the counts, the device share and coverage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO, corpus_model

CHILD = r"""
import json, os, resource, signal, sys, time
sys.path.insert(0, os.getcwd())
from tests.verdicts import wrapped_bug
import coverage
cov = coverage.Coverage(source_pkgs=["tflgpu"], data_file=None)
cov.start()
import numpy as np
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # an unbounded allocation fails here, loudly
from tflgpu import GpuDelegate, Interpreter

paths, seed, seconds, max_n, gpu_every = sys.argv[1].split(","), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = np.random.default_rng(seed)
originals = [open(p, "rb").read() for p in paths]
EXTREMES = [b"\xff\xff\xff\xff", b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\x00\x00\x00\x00", b"\x01\x00\x01\x00"]

class Hang(Exception):
    pass

def on_alarm(*_):
    raise Hang()

signal.signal(signal.SIGALRM, on_alarm)
def where_of(e):
    import traceback
    frames = traceback.extract_tb(e.__traceback__)[-2:]
    return [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames]

def mutate(data):
    d = bytearray(data)
    kind = rng.integers(0, 4)
    if kind == 0:  # bit flips
        for pos in rng.integers(0, len(d), rng.integers(1, 6)):
            d[pos] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1:  # an extreme int32 over an aligned field (sizes, offsets, indices, dims)
        for _ in range(rng.integers(1, 3)):
            pos = int(rng.integers(0, len(d) // 4)) * 4
            d[pos:pos + 4] = EXTREMES[rng.integers(0, len(EXTREMES))]
    elif kind == 2:  # splice: a chunk copied over another place
        n = int(rng.integers(4, 64))
        a, b = (int(v) for v in rng.integers(0, max(1, len(d) - n), 2))
        d[b:b + n] = d[a:a + n]
    else:  # truncation
        d = d[: int(rng.integers(8, len(d)))]
    return bytes(d), ["flip", "extreme", "splice", "truncate"][kind]

save_dir = os.environ.get("TFLGPU_FUZZ_FINDINGS")  # each finding's model is written there, to reproduce

def finding(kind, what, where, data):
    if save_dir:
        os.makedirs(save_dir, exist_ok=True)
        name = os.path.join(save_dir, f"finding_{stats['tried']}_{kind}.tflite")
        open(name, "wb").write(data)
        where = where + [name]
    stats["bad"].append((kind, what, where))

LITERT_TIMER = (
    "import sys, time, numpy as np\n"
    "from ai_edge_litert.interpreter import Interpreter\n"
    "it = Interpreter(model_path=sys.argv[1]); t = time.perf_counter(); it.allocate_tensors()\n"
    "for d in it.get_input_details(): it.set_tensor(d['index'], np.ones(d['shape'], d['dtype']))\n"
    "it.invoke(); print(time.perf_counter() - t)\n")

def litert_seconds(data):
    # LiteRT's time for the mutant (allocate and one invoke), in a process of its own (a mutant may crash it);
    # None when it cannot run it within 120 s
    import subprocess, tempfile
    with tempfile.NamedTemporaryFile(suffix=".tflite") as f:
        f.write(data); f.flush()
        try:
            r = subprocess.run([sys.executable, "-c", LITERT_TIMER, f.name], capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return None
    try:
        return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    except (ValueError, IndexError):
        return None

def attempt(data, use_gpu, limit):
    # construct, allocate, set ones, invoke within `limit` seconds: the interpreter, or raises
    signal.alarm(limit)
    try:
        it = Interpreter(model_content=data, delegate=GpuDelegate(cache=False) if use_gpu else None)
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
        it.invoke()
        return it
    finally:
        signal.alarm(0)

HANG_S = 60  # a mutant still running after this is timed against LiteRT: real work (an 800 MB input) or a hang
SLOWER = 25  # what "real work" may take here: LiteRT's time times this (numpy/numba CPU kernels, the GPU path's
             # shape run), plus HANG_S

stats = {"tried": 0, "ran": 0, "rejected": 0, "gpu_tried": 0, "gpu": 0, "gpu_quantized": 0, "bad": [], "slow": []}
t0 = time.time()
while stats["tried"] < max_n and time.time() - t0 < seconds:
    source = stats["tried"] % len(originals)
    data, kind = mutate(originals[source])
    use_gpu = gpu_every and (stats["tried"] // len(originals)) % gpu_every == 0  # every source model in turn
    stats["tried"] += 1
    stats["gpu_tried"] += bool(use_gpu)
    try:
        try:
            it = attempt(data, use_gpu, HANG_S)
        except Hang:
            ref = litert_seconds(data)
            if ref is None or ref < 1.0:  # LiteRT cannot run it, or runs it at once: ours hung
                raise
            t1 = time.time()
            it = attempt(data, use_gpu, HANG_S + int(SLOWER * ref))
            stats["slow"].append((kind, "gpu" if use_gpu else "cpu", round(time.time() - t1, 1), round(ref, 2)))
        stats["ran"] += 1
        on_device = bool(use_gpu and it.gpu_plan is not None)
        stats["gpu"] += on_device
        stats["gpu_quantized"] += on_device and source == len(originals) - 1
    except (ValueError, RuntimeError) as e:
        bug = wrapped_bug(e)
        if bug is None:
            stats["rejected"] += 1
        else:
            finding(kind, f"{type(e).__name__}: {str(e)[:200]} <- {type(bug).__name__}", where_of(bug), data)
    except Hang:
        finding(kind, f"hang (> {HANG_S} s, and over {SLOWER}x LiteRT's time where LiteRT runs it)", [], data)
    except BaseException as e:  # anything else is a finding
        finding(kind, f"{type(e).__name__}: {str(e)[:200]}", where_of(e), data)
cov.stop()
import io, tflgpu.model.reader as reader_mod
stats["coverage_total"] = round(cov.report(file=io.StringIO()), 1)
_, statements, _, missing, _ = cov.analysis2(reader_mod.__file__)
stats["coverage_reader"] = round(100 * (1 - len(missing) / max(1, len(statements))), 1)
print(json.dumps(stats))
"""


CI_MUTANTS = 240  # (about 50 s on a CI machine)
CI_CAP_S = 900.0  # (past this, fewer mutants than CI_MUTANTS: a failure, not a quietly smaller run)


def test_fuzzed_corpus_models(opencl_device, tmp_path):
    from .qutil import small_quantized_model

    quantized = tmp_path / "small_int8.tflite"  # the integer kernels and the float view get mutants too
    quantized.write_bytes(small_quantized_model())
    paths = [str(corpus_model(n)) for n in ("opzoo_small.tflite", "lstm_small.tflite", "fallback_ops.tflite")]
    paths.append(str(quantized))
    # CI: a fixed seed's first CI_MUTANTS mutants, the same ones on any machine however fast (a failure is the
    # same mutant again); offline, TFLGPU_FUZZ_SECONDS: as many as that allows
    offline = os.environ.get("TFLGPU_FUZZ_SECONDS")
    seconds, count = (float(offline), 10**6) if offline else (CI_CAP_S, CI_MUTANTS)
    env = {**os.environ, "TFLGPU_TUNING": "none"}
    seed = os.environ.get("TFLGPU_FUZZ_SEED", "11")  # (offline, several seeds run side by side)
    r = subprocess.run([sys.executable, "-c", CHILD, ",".join(paths), seed, str(seconds), str(count), "3"],
                       capture_output=True, text=True, timeout=seconds + 600, env=env, cwd=REPO, check=False)
    assert r.returncode == 0, f"the fuzz child died (signal {-r.returncode})" if r.returncode < 0 else r.stderr[-3000:]
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\nfuzz: {stats['tried']} mutants, {stats['ran']} ran, {stats['rejected']} refused with a verdict; "
          f"{stats['gpu_tried']} sent through GpuDelegate, {stats['gpu']} ran on a device plan "
          f"({stats['gpu_quantized']} of the int8 model); line coverage: model reader "
          f"{stats['coverage_reader']}%, tflgpu {stats['coverage_total']}%"
          + (f"; over 60 s but within 25x LiteRT's time (kind, path, s, LiteRT s): {stats['slow']}"
             if stats["slow"] else ""))
    assert not stats["bad"], "\n".join(map(str, stats["bad"][:20]))
    assert stats["tried"] >= (100 if offline else CI_MUTANTS) and stats["rejected"] > 0 and stats["ran"] > 0, stats
    assert stats["gpu_tried"] * 3 >= stats["tried"] - len(paths) * 3, "a third of the mutants go through the delegate"
    assert stats["gpu"] >= stats["gpu_tried"] // 10 and stats["gpu_quantized"] > 0, stats


@pytest.mark.parametrize("dims", [[1 << 30, 1 << 30], [-5, 3], [2, 3, 0x7FFFFFFF]])
def test_giant_or_negative_dimensions(dims):
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (2, 3))
    y = b.tensor("y", (2, 3))
    b.op("RELU", [x], [y])
    b.output(y)
    b.main.tensors[y].shape = tuple(dims)  # the declared shape of the intermediate
    with pytest.raises(ValueError):
        it = Interpreter(model_content=b.build())
        it.allocate_tensors()
        it.invoke()


def test_activation_claims_are_bounded_by_file_size(monkeypatch):
    """A tiny file may not declare activations far beyond what its size could justify."""
    import tflgpu.model.reader as reader
    from tflgpu import Interpreter
    from tflgpu.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (64, 1024, 1024))  # 256 MiB of float32, from a file of a few hundred bytes
    y = b.tensor("y", (64, 1024, 1024))
    b.op("RELU", [x], [y])
    b.output(y)
    model = b.build()
    monkeypatch.setattr(reader, "ACTIVATION_FLOOR_BYTES", 64 << 20)
    with pytest.raises(ValueError, match="tensors claim .* over the limit"):
        Interpreter(model_content=model)
    monkeypatch.setattr(reader, "ACTIVATION_FLOOR_BYTES", 1 << 30)
    assert Interpreter(model_content=model).get_input_details()[0]["shape"].tolist() == [64, 1024, 1024]

