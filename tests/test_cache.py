"""The serialization cache: warm starts load everything, damaged entries are detected, logged, rebuilt and
replaced, concurrent warmups never corrupt it, permissions and the size bound hold."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import xxhash

from tflgpu import GpuDelegate, Interpreter
from tflgpu.cache.store import CacheStore, decode_entry, encode_entry
from tflgpu.cli import main
from tflgpu.model.default_model import DEFAULT_MODEL_PATH

from .conftest import assert_close, litert, run_model

MODEL = DEFAULT_MODEL_PATH


@pytest.fixture(scope="module")
def reference():
    from tflgpu.benchmark import reference_inputs

    inputs = reference_inputs(Interpreter(model_path=str(MODEL)).get_input_details())
    return inputs, run_model(litert(), str(MODEL), inputs)


def build(cache_dir, **kw):
    """An allocated Interpreter of MODEL with a delegate using ``cache_dir`` (the plan is built, or loaded)."""
    kw.setdefault("tuning", "none")
    it = Interpreter(model_path=str(MODEL), delegate=GpuDelegate(serialization_dir=cache_dir, **kw))
    it.allocate_tensors()
    return it


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, opencl_device):
    """A cache the model was built into (no tuning), once a module."""
    root = tmp_path_factory.mktemp("pristine") / "cache"
    build(root)
    return root


def copy_of(pristine, dest):
    """``dest``: a copy of the pristine cache (its files and modes): what building the model there would leave, for
    tests that damage one. The build is the same one each time; the rebuilds after the damage are what they test."""
    shutil.copytree(pristine, dest, symlinks=True, dirs_exist_ok=True)
    return dest


def outputs(it, inputs):
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def check(it, reference):
    inputs, ref = reference
    got = outputs(it, inputs)
    for g, r in zip(got, ref):
        assert_close(g, r)
    return got


def files(root, kind):
    return sorted(root.glob(f"v1/*/{kind}/*.bin"))


def test_warm_start_loads_everything(tmp_path, opencl_device, new_process, reference):
    cold = build(tmp_path, tuning="fast", tuning_budget_s=60, tuning_trials=2)
    assert cold.gpu_plan.build_stats["plan"] == "built" and cold.gpu_plan.build_stats["source_builds"] >= 1
    assert any(k.source == "tuned" for k in cold.gpu_plan.tuning_results)
    assert all(k.result.decided for k in cold.gpu_plan.tuning_results if k.source == "tuned")  # (every one recorded)
    first = check(cold, reference)
    size = CacheStore(tmp_path).total_bytes()
    warm = build(tmp_path, tuning="fast", tuning_budget_s=60, tuning_trials=2)
    stats = warm.gpu_plan.build_stats
    assert stats["plan"] == "cache" and stats["source_builds"] == 0 and stats["binary_loads"] >= 1
    # nothing searched: the stored plan's kernels are checked against their records, and each has one
    assert {k.source for k in warm.gpu_plan.tuning_results} == {"record"} and warm.gpu_plan.tuning_seconds == 0
    assert [s.params for s in warm.gpu_plan.steps] == [s.params for s in cold.gpu_plan.steps]
    for a, b in zip(first, check(warm, reference)):
        np.testing.assert_array_equal(a, b)  # the same kernels: identical outputs
    assert CacheStore(tmp_path).total_bytes() == size  # nothing new built: the cache did not grow


def _small(rng, tmp_path):
    """A one-conv model (a search of one kernel), its file, and LiteRT's output on its inputs."""
    from .oputil import conv_model

    model, feeds = conv_model(rng)
    path = tmp_path / "conv.tflite"
    path.write_bytes(model)
    return path, feeds, run_model(litert(), model, feeds)[0]


def _start(path, cache, feeds, **kw):
    it = Interpreter(model_path=str(path), delegate=GpuDelegate(serialization_dir=cache, **kw))
    return it, run_model(lambda **_: it, str(path), feeds)[0]


def test_a_warmup_is_the_default_delegates_start(tmp_path, opencl_device, rng):
    """`tflgpu warmup` (a "fast" search) stores the plan that the default GpuDelegate (tuning "background", tiered
    compile) starts from: how a stored plan's parameters were decided is not part of its identity, they are
    checked against the records at every start. (The default delegate found no plan of its own tuning mode,
    built one and compiled a quick program: MobileNet v2 started in 3.7 s after a warmup instead of 0.5 s.)"""
    path, feeds, want = _small(rng, tmp_path)
    cache = tmp_path / "cache"
    assert main(["warmup", str(path), "--trials", "2", "--budget-s", "120", "--cache-dir", str(cache), "-q"]) == 0
    it, got = _start(path, cache, feeds, tuning="background", tiered_compile=True)
    assert_close(got, want)
    assert it.gpu_plan.build_stats == {"source_builds": 0, "binary_loads": 1, "plan": "cache", "tier": "optimized"}
    assert it.gpu_plan.background is None  # (every kernel has a record: nothing left to search or build)
    assert {k.source for k in it.gpu_plan.tuning_results} == {"record"}


def test_a_stored_plan_is_searched_where_it_holds_no_decision(tmp_path, opencl_device, rng):
    """A plan stored by a start that searched nothing (tuning "none") is the start of a later "fast" one too: its
    kernels without a record are searched then (blocking, as "fast" does), and the plan is stored again as the
    search leaves it, so the next start loads it and searches nothing."""
    path, feeds, want = _small(rng, tmp_path)
    _start(path, tmp_path, feeds, tuning="none")
    fast, got = _start(path, tmp_path, feeds, tuning="fast", tuning_trials=2, tuning_budget_s=120)
    assert fast.gpu_plan.build_stats["plan"] == "cache" and fast.gpu_plan.tuning_seconds > 0
    assert {k.source for k in fast.gpu_plan.tuning_results} == {"tuned"}
    assert all(k.result.decided for k in fast.gpu_plan.tuning_results)
    assert_close(got, want)
    again, got = _start(path, tmp_path, feeds, tuning="fast", tuning_trials=2, tuning_budget_s=120)
    stats = again.gpu_plan.build_stats
    assert stats["plan"] == "cache" and stats["source_builds"] == 0 and again.gpu_plan.tuning_seconds == 0
    assert {k.source for k in again.gpu_plan.tuning_results} == {"record"}
    assert [s.params for s in again.gpu_plan.steps] == [s.params for s in fast.gpu_plan.steps]
    assert again.gpu_plan.program_key() == fast.gpu_plan.program_key()
    assert_close(got, want)


def test_default_token_and_layout(tmp_path, opencl_device):
    it = build(tmp_path)
    token = xxhash.xxh64_hexdigest(MODEL.read_bytes())
    (plan,) = files(tmp_path, "plan")
    assert plan.name.startswith(token + "-")
    assert oct(tmp_path.stat().st_mode & 0o777) == oct(0o700) or tmp_path.stat().st_mode & 0o077 == 0
    for p in tmp_path.rglob("*"):
        mode = p.stat().st_mode & 0o777
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))
    assert it.gpu_plan.store.root == tmp_path


def test_user_token(tmp_path, opencl_device):
    build(tmp_path, model_token="my-model_v2.1")
    assert files(tmp_path, "plan")[0].name.startswith("my-model_v2.1-")
    for bad in ["../escape", "a/b", "", "x" * 200]:
        with pytest.raises(ValueError, match="model_token"):
            GpuDelegate(model_token=bad)


def rewrite(path, mutate):
    """Rewrite an entry with its header/payload changed and a checksum that matches again."""
    head, payload = decode_entry(path.read_bytes())
    head, payload = mutate(dict(head), payload)
    path.write_bytes(encode_entry(head["kind"], head["key"], head["device_key"], payload,
                                  library_version=head["library_version"]))


def flip_byte(path, at=-20):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["binary-bitflip", "binary-rejected", "plan-truncated", "plan-garbage",
                                    "older-driver", "older-library", "older-schema"])
def test_damaged_entries_are_detected_and_rebuilt(tmp_path, opencl_device, new_process, reference, caplog, damage, pristine):
    copy_of(pristine, tmp_path)
    programs, (plan,) = files(tmp_path, "program"), files(tmp_path, "plan")
    if damage == "binary-bitflip":
        flip_byte(programs[0], at=len(programs[0].read_bytes()) // 2)
    elif damage == "binary-rejected":  # intact entry, but the driver cannot load what it holds
        rewrite(programs[0], lambda h, p: (h, b"\x7fELF not a program binary" * 8))
    elif damage == "plan-truncated":
        plan.write_bytes(plan.read_bytes()[: len(plan.read_bytes()) // 2])
    elif damage == "plan-garbage":
        plan.write_bytes(os.urandom(300))
    elif damage == "older-driver":
        rewrite(plan, lambda h, p: ({**h, "device_key": h["device_key"].replace("|OpenCL C", ".old|OpenCL C")}, p))
    elif damage == "older-library":  # a plan holds the whole library's decisions: another tflgpu's is rebuilt
        rewrite(plan, lambda h, pl: ({**h, "library_version": "0.0.1+gen0"}, pl))
    elif damage == "older-schema":  # a program read with another schema is not trusted
        for p in programs:
            rewrite(p, lambda h, pl: ({**h, "library_version": "schema-0"}, pl))
    before = {p.name for p in files(tmp_path, "program")} | {plan.name}
    with caplog.at_level(logging.INFO, logger="tflgpu"):
        it = build(tmp_path)
    # (damage is a warning; an entry another tflgpu, device or driver wrote is routine after an upgrade: INFO)
    ignored = [r.levelno for r in caplog.records if "tflgpu cache: ignoring" in r.getMessage()]
    assert ignored and set(ignored) == {logging.INFO if damage.startswith("older") else logging.WARNING}, caplog.text
    stats = it.gpu_plan.build_stats
    if damage.startswith("plan") or damage in ("older-driver", "older-library"):
        assert stats["plan"] == "built"
    else:
        assert stats["source_builds"] >= 1
    check(it, reference)  # still correct
    after = {p.name for p in files(tmp_path, "program")} | {p.name for p in files(tmp_path, "plan")}
    assert before <= after  # replaced
    assert all(e.problem is None for e in CacheStore(tmp_path).entries())  # and the cache verifies clean
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tflgpu"):
        again = build(tmp_path)
    assert "ignoring" not in caplog.text and again.gpu_plan.build_stats["source_builds"] == 0


def test_another_tflgpu_keeps_programs_and_tuning_records(tmp_path, opencl_device, reference, monkeypatch, caplog):
    """An upgrade (another LIBRARY_VERSION) rebuilds the plans, whose decisions are the whole library's, but loads
    the compiled programs (content-addressed) and takes the tuning records of generators it did not change."""
    import tflgpu.cache.store as store_module
    from tflgpu.kernels.program import COMPILED

    cold = build(tmp_path, tuning="fast", tuning_budget_s=10, tuning_trials=2)
    # (a kernel the budget left unsearched has no record: the next start searches it)
    tuned = {k.key for k in cold.gpu_plan.tuning_results if k.source == "tuned" and k.result.decided}
    assert tuned
    monkeypatch.setattr(store_module, "LIBRARY_VERSION", store_module.LIBRARY_VERSION + ".next")
    COMPILED.clear()  # (as a new process: what it loads is the cache's)
    with caplog.at_level(logging.INFO, logger="tflgpu"):  # (an outdated entry is routine: logged at INFO)
        it = build(tmp_path)  # (no search: one the first build's budget left undone would build a new program)
    stats = it.gpu_plan.build_stats
    assert stats["plan"] == "built" and stats["source_builds"] == 0, stats
    assert tuned <= {k.key for k in it.gpu_plan.tuning_results if k.source == "record"}
    assert caplog.text.count("ignoring") == len(files(tmp_path, "plan")) == 1, caplog.text  # (the old plan)
    check(it, reference)


def test_damaged_tuning_record_is_retuned(tmp_path, opencl_device, reference, caplog):
    build(tmp_path, tuning="fast", tuning_budget_s=10, tuning_trials=2)
    for p in files(tmp_path, "plan"):
        p.unlink()
    # the records a plan takes (named by their kernels' keys): not those of the parts of a block the search left
    # unfused for a while, which the plan runs fused
    used = {k.key for k in build(tmp_path).gpu_plan.tuning_results if k.source == "record"}
    records = [p for p in files(tmp_path, "tuning") if p.stem in used]
    assert records
    flip_byte(records[0])
    for p in files(tmp_path, "plan"):
        p.unlink()  # so the next construction consults the records
    it = build(tmp_path, tuning="fast", tuning_budget_s=10, tuning_trials=2)
    assert "checksum mismatch" in caplog.text
    assert any(k.source == "tuned" for k in it.gpu_plan.tuning_results)  # the lost record was searched again
    check(it, reference)
    assert all(e.problem is None for e in CacheStore(tmp_path).entries())


def test_unsafe_directories_are_refused(tmp_path, opencl_device):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(ValueError, match=r"cannot be used: it is writable by others \(mode 777: chmod 700 it\)"):
        build(d)
    if os.getuid() == 0:
        d2 = tmp_path / "other"
        d2.mkdir(mode=0o700)
        os.chown(d2, 12345, 12345)
        with pytest.raises(ValueError, match=r"cannot be used: it is owned by uid 12345, not by this user"):
            build(d2)


def test_cache_off_writes_nothing(tmp_path, opencl_device, reference):
    it = Interpreter(model_path=str(MODEL), delegate=GpuDelegate(serialization_dir=tmp_path, cache=False))
    check(it, reference)
    assert list(tmp_path.iterdir()) == []


def test_eviction_keeps_the_bound_and_the_recent(tmp_path, opencl_device):
    build(tmp_path)
    full = CacheStore(tmp_path).total_bytes()
    bound = full + full // 2
    store = CacheStore(tmp_path, max_bytes=bound)
    os.utime(files(tmp_path, "plan")[0], (1, 1))  # the least recently used entry
    store.put("plan", "other-0", "dev", b"x" * (full // 2 + 100))  # pushes the total over the bound
    assert store.total_bytes() <= bound
    assert not any(p.name.startswith(xxhash.xxh64_hexdigest(MODEL.read_bytes())) for p in files(tmp_path, "plan"))
    assert store.stats["evicted"] >= 1
    it = build(tmp_path, max_cache_bytes=bound)  # the evicted plan is rebuilt; the bound still holds
    assert it.gpu_plan.build_stats["plan"] == "built"
    assert CacheStore(tmp_path).total_bytes() <= bound


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tflgpu.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_concurrent_warmups_and_cache_commands(tmp_path, opencl_device, rng):
    from .oputil import conv_model

    other = tmp_path / "conv.tflite"
    other.write_bytes(conv_model(rng)[0])
    cache = tmp_path / "cache"
    # (two candidates a kernel: the three processes share the cache, whatever the search finds)
    cmd = [sys.executable, "-m", "tflgpu.cli", "warmup", str(MODEL), str(other), "--tuning", "fast", "--trials", "2",
           "--cache-dir", str(cache), "-q"]
    env = {**os.environ, "TFLGPU_TUNING": ""}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert "default.tflite [fp32]" in out and "conv.tflite [fp32]" in out
    r = cli("cache", "verify", "--cache-dir", str(cache))
    assert r.returncode == 0 and " 0 bad" in r.stdout, r.stdout + r.stderr
    assert not list(cache.rglob("*.tmp"))  # no temp file left behind
    r = cli("cache", "ls", "--cache-dir", str(cache))
    token = xxhash.xxh64_hexdigest(MODEL.read_bytes())
    # plans grouped by model: one line each, with the file name stored with the plan and the token
    (row,) = [line for line in r.stdout.splitlines() if token in line]
    assert row.startswith("default.tflite ") and row.split()[2] == "1", r.stdout
    assert any(line.startswith("conv.tflite ") for line in r.stdout.splitlines()), r.stdout
    assert "fp32; input 1x" in r.stdout and "compiled programs" in r.stdout
    programs = files(cache, "program")
    assert not any(p.stem in r.stdout for p in programs)  # summarized: one line, unless --all
    r = cli("cache", "ls", "--all", "--cache-dir", str(cache))
    assert all(p.stem[:40] in r.stdout for p in programs), r.stdout
    r = cli("cache", "stats", "--cache-dir", str(cache))
    assert "plan" in r.stdout and "entries" in r.stdout
    r = cli("cache", "clear", "--model", token, "--cache-dir", str(cache))
    assert r.returncode == 0 and "removed 1 entries" in r.stdout, r.stdout
    assert not any(p.name.startswith(token) for p in files(cache, "plan")) and files(cache, "plan")
    r = cli("cache", "clear", "--model", token, "--cache-dir", str(cache))  # nothing left of it: an error
    assert r.returncode == 1 and f"no stored plans for --model {token}" in r.stderr, r.stdout + r.stderr
    r = cli("cache", "ls", "--model", str(other), "--cache-dir", str(cache))  # a model file names its plans
    assert r.returncode == 0 and xxhash.xxh64_hexdigest(other.read_bytes()) in r.stdout, r.stdout + r.stderr
    r = cli("cache", "clear", "--model", str(other), "--cache-dir", str(cache))
    assert r.returncode == 0 and "removed 1 entries" in r.stdout, r.stdout
    warm = cli("warmup", str(other), "--tuning", "none", "--cache-dir", str(cache), "-q")
    assert warm.returncode == 0 and files(cache, "plan")
    flip_byte(files(cache, "program")[0], at=100)
    r = cli("cache", "verify", "--cache-dir", str(cache))
    assert r.returncode == 1 and "BAD" in r.stdout
    r = cli("cache", "verify", "--fix", "--cache-dir", str(cache))
    assert r.returncode == 0 and cli("cache", "verify", "--cache-dir", str(cache)).returncode == 0
    r = cli("cache", "clear", "--cache-dir", str(cache))
    assert r.returncode == 0 and not files(cache, "program")


@pytest.mark.parametrize("attack", ["symlinked-entry", "symlinked-dir", "world-writable", "huge", "other-user"])
def test_hostile_entries_are_never_followed_or_loaded(tmp_path, opencl_device, reference, caplog, attack, pristine):
    cache = copy_of(pristine, tmp_path / "cache")
    (plan,) = files(cache, "plan")
    victim = tmp_path / "victim.bin"
    original = plan.read_bytes()
    victim.write_bytes(original)  # a valid entry, outside the cache
    if attack == "symlinked-entry":
        plan.unlink()
        plan.symlink_to(victim)
    elif attack == "symlinked-dir":
        outside = tmp_path / "outside"
        outside.mkdir()
        os.replace(plan.parent, outside / "plan")
        plan.parent.symlink_to(outside / "plan")
    elif attack == "world-writable":
        plan.chmod(0o666)
    elif attack == "huge":
        with open(plan, "r+b") as f:
            f.truncate(2 << 30)  # sparse: claims 2 GiB
    else:
        if os.getuid() != 0:
            pytest.skip("needs root to give a file to another user")
        os.chown(plan, 12345, 12345)
    it = build(cache)
    assert "tflgpu cache: ignoring" in caplog.text
    assert it.gpu_plan.build_stats["plan"] == "built"  # refused, rebuilt
    check(it, reference)
    assert victim.read_bytes() == original  # the link's target is untouched
    (new,) = files(cache, "plan")
    assert not new.is_symlink() and not new.parent.is_symlink() and new.stat().st_mode & 0o777 == 0o600
    assert new.stat().st_size < 1 << 20
    assert all(e.problem is None for e in CacheStore(cache).entries())


def _unusable(tmp_path, case: str) -> str:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    return {"under-proc": "/proc/tflgpu-cache", "a-file": str(a_file), "under-a-file": str(a_file / "sub"),
            "unwritable": "/proc/self"}[case]


@pytest.mark.parametrize("case", ["under-proc", "a-file", "under-a-file", "unwritable"])
def test_unusable_cache_directory_named_by_the_user_is_one_clear_error(tmp_path, case, monkeypatch):
    """serialization_dir= or TFLGPU_CACHE_DIR naming a directory that cannot be used: one ValueError naming
    the directory, what set it and the way out, at construction; no OS error from deep in a write, and a file
    given as the directory is left as it was."""
    from tflgpu.cache.paths import CacheDirError

    path = _unusable(tmp_path, case)
    before = (tmp_path / "a_file").read_text()
    with pytest.raises(CacheDirError, match=rf"^the cache directory {re.escape(path)} \(set by GpuDelegate\(serialization_dir"
                                            r"=\.\.\.\)\) cannot be used: .*; choose another directory, or run without "
                                            r"the cache \(GpuDelegate\(cache=False\)\)$"):
        Interpreter(str(MODEL), delegate=GpuDelegate(serialization_dir=path))
    monkeypatch.setenv("TFLGPU_CACHE_DIR", path)
    with pytest.raises(ValueError, match=r"\(set by TFLGPU_CACHE_DIR\) cannot be used"):
        Interpreter(str(MODEL), delegate=GpuDelegate())
    assert (tmp_path / "a_file").read_text() == before
    assert main(["cache", "ls", "--cache-dir", path]) == 1


def test_unusable_default_cache_directory_warns_once_and_runs(monkeypatch, caplog, opencl_device):
    """The default directory (nobody named it) unusable: one warning, and the model runs without the cache."""
    monkeypatch.delenv("TFLGPU_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-cache-here")
    it = Interpreter(str(MODEL), delegate=GpuDelegate(tuning="none"))
    warnings = [r for r in caplog.records if "cannot be used" in r.getMessage()]
    assert len(warnings) == 1 and "/proc/no-cache-here/tflgpu" in warnings[0].getMessage()
    assert it.gpu_plan is not None and it.gpu_plan.store is None
    it.allocate_tensors()
    it.invoke()


def test_missing_parents_of_a_cache_directory_are_created_private(tmp_path):
    from tflgpu.cache.store import CacheStore

    store = CacheStore(tmp_path / "a" / "b" / "cache")
    assert store.root.is_dir() and all((tmp_path / p).stat().st_mode & 0o777 == 0o700 for p in ("a", "a/b", "a/b/cache"))


def _contents(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_read_only_cache_is_used_and_left_as_it_is(tmp_path, opencl_device, pristine, reference, monkeypatch, capsys):
    """A cache warmed into an image that runs read-only (a read-only mount; here every file creation under it
    fails with EROFS, as on one): the stored plan and programs load, the model runs as LiteRT does, no search
    starts (what it found could not be kept), and nothing in it changes; `cache clear` says it is read-only.
    Before, the named directory was refused ("cannot be used: Read-only file system"), so such an image compiled
    at every start. An unwritable directory holding no cache is still refused (a mistake more likely)."""
    import errno
    import tempfile

    from tflgpu.cache import paths

    cache = copy_of(pristine, tmp_path / "baked")
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    before = _contents(cache)
    mkstemp = tempfile.mkstemp

    def read_only(*args, dir=None, **kw):  # (the probe and every atomic write make their file so)
        if dir is not None and any(str(dir).startswith(str(d)) for d in (cache, empty)):
            raise OSError(errno.EROFS, "Read-only file system")
        return mkstemp(*args, dir=dir, **kw)

    monkeypatch.setattr(paths.tempfile, "mkstemp", read_only)
    it = Interpreter(str(MODEL), delegate=GpuDelegate(serialization_dir=cache))  # (the default tuning)
    it.allocate_tensors()
    assert it.gpu_plan.store.read_only and it.gpu_plan.build_stats["plan"] == "cache"
    assert it.gpu_plan.build_stats["source_builds"] == 0 and it.tuning_status() is None
    check(it, reference)
    assert _contents(cache) == before
    with pytest.raises(ValueError, match="cannot be used: Read-only file system"):
        Interpreter(str(MODEL), delegate=GpuDelegate(serialization_dir=empty))
    assert main(["cache", "clear", "--cache-dir", str(cache)]) == 1
    assert f"the cache directory {cache} is read-only: nothing can be removed from it" in capsys.readouterr().err
    assert _contents(cache) == before
