"""Fleet tuning on a real PostgreSQL server, started by the test (``pgserver``: a self-contained server from
PyPI): three ``tflgpu tune`` processes, each with its own cache directory (three "machines"), search one
model's kernels in one shared optuna storage; every worker measures trials, all record the same decision,
and a fourth machine that searches nothing takes the decisions from the storage and uses them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import unavailable
from .oputil import conv_model

CHECK = r"""
import json, sys
from tflgpu import GpuDelegate, Interpreter
it = Interpreter(sys.argv[1], delegate=GpuDelegate(tuning="none"))
print(json.dumps([[k.key, k.source, k.params] for k in it.gpu_plan.tuning_results], default=str))
"""


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of its own (a short directory: its Unix socket path must stay under 108 bytes),
    with an empty database for the study; its URL for SQLAlchemy (psycopg, its default PostgreSQL driver)."""
    try:
        import pgserver
        import psycopg  # noqa: F401 (SQLAlchemy's postgresql:// driver)
    except ImportError as e:
        unavailable(f"pgserver / psycopg not installed ({e}; pip install -e '.[test]')", "TFLGPU_REQUIRE_POSTGRES")
    root = tempfile.mkdtemp(prefix="tflgpu-pg-")
    try:
        server = pgserver.get_server(root, cleanup_mode="stop")
    except Exception as e:  # noqa: BLE001 (whatever keeps the server from starting: skipped, with the reason)
        shutil.rmtree(root, ignore_errors=True)
        unavailable(f"a PostgreSQL server could not start here: {e}", "TFLGPU_REQUIRE_POSTGRES")
    try:
        server.psql("CREATE DATABASE tflgpu_fleet;")
        yield f"postgresql://postgres:@/tflgpu_fleet?host={root}"
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def _env(cache: Path) -> dict:
    return {**os.environ, "TFLGPU_CACHE_DIR": str(cache), "TFLGPU_TUNING": ""}


def _records(cache: Path) -> dict:
    from tflgpu.autotune.records import CacheTuningDB
    from tflgpu.cache.store import CacheStore

    return {k: r for _, k, r in CacheTuningDB(CacheStore(cache)).items()}


def test_three_machines_share_one_postgres_study(postgres, opencl_device, rng, tmp_path):
    import optuna

    model = tmp_path / "conv.tflite"
    model.write_bytes(conv_model(rng)[0])
    machines = [tmp_path / f"machine{i}" for i in range(3)]
    # each worker stops at 12 compiled candidates of its own; the budget only has to leave room for them: fast
    # mode's 30 s includes the worker's start and first compile, which on a loaded machine (CI's, running the
    # suite beside it) left one worker's search no time at all (2 workers in the study, not 3)
    cmd = [sys.executable, "-m", "tflgpu.cli", "tune", str(model), "--mode", "fast", "--trials", "12",
           "--storage", postgres, "--repeat", "30", "--budget-s", "600", "-q", "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(m))
             for m in machines]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out[out.index("\n[") + 1:]))

    # one study per kernel, holding trials that every one of the three workers measured
    (summary,) = optuna.get_all_study_summaries(postgres)
    study = optuna.load_study(study_name=summary.study_name, storage=postgres)
    workers = {t.user_attrs.get("worker") for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert len(workers) == 3, workers
    assert {k for k in study.user_attrs if k.startswith("worker:")} == {f"worker:{w}" for w in workers}
    decision = study.user_attrs["decision"]
    complete = sum(1 for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert decision["trials"] == complete

    # every machine recorded the same decision, the one the study holds
    records = [_records(m) for m in machines]
    assert all(len(r) == 1 for r in records), records
    ((key, first),) = records[0].items()
    assert key in summary.study_name
    for r, out in zip(records, outs):
        assert r[key].params == first.params and r[key].trials == complete, (r, out[0]["verdict"])
        assert out[0]["verdict"].startswith("stored 1 records"), out[0]["verdict"]
    assert {k: repr(v) for k, v in first.params.items()} == decision["params"]

    # a fourth machine searches nothing: it takes the decision from the storage, records it, and uses it
    fourth = tmp_path / "machine3"
    r = subprocess.run([sys.executable, "-m", "tflgpu.cli", "tune", str(model), "--fetch", "--storage", postgres,
                        "--repeat", "30", "-q", "--json"], capture_output=True, text=True, timeout=600,
                       env=_env(fourth), check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout[r.stdout.index("\n[") + 1:])
    assert [k["search"] for k in doc[0]["kernels"]] == [f"fetched ({complete} trials)"]
    assert len(optuna.load_study(study_name=summary.study_name, storage=postgres).trials) == len(study.trials)
    assert _records(fourth)[key].params == first.params
    used = subprocess.run([sys.executable, "-c", CHECK, str(model)], capture_output=True, text=True, timeout=600,
                          env=_env(fourth), check=False)
    assert used.returncode == 0, used.stderr[-3000:]
    ((used_key, source, params),) = json.loads(used.stdout.strip().splitlines()[-1])
    assert (used_key, source) == (key, "record")
    assert params == json.loads(json.dumps(first.params, default=str))


def test_fetch_needs_a_storage(tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(b"\0" * 64)
    r = subprocess.run([sys.executable, "-m", "tflgpu.cli", "tune", "--fetch", str(model)], capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 2 and "--fetch takes the decisions other workers stored" in r.stderr, r.stderr
