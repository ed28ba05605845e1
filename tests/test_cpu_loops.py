"""WHILE loops compiled whole for the CPU kernels (tflgpu.cpu.loops), against LiteRT and the interpreted loop."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from tflgpu import Interpreter
from tflgpu.cpu import loops

from .conftest import MODELS_DIR, assert_close, litert, run_model
from .oputil import while_model


def _interp(model, feeds):
    it = Interpreter(model_content=model) if isinstance(model, bytes) else Interpreter(model_path=str(model))
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    return it


def _outputs(it):
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _forget_loaded_loops():
    for name in [n for n in sys.modules if n.startswith("tflgpu_loop_")]:
        del sys.modules[name]


def _slot(it):
    (slot,) = it._runtime.loops
    return slot


@pytest.mark.parametrize("static_counter", [True, False])
def test_a_time_loop_runs_compiled_and_matches_litert(static_counter):
    model, feeds = while_model(np.random.default_rng(3), static_counter=static_counter)
    it = _interp(model, feeds)
    it.invoke()
    loop = _slot(it).get()
    assert loop is not None and loop.failed is None and loop.checked, "the loop was not compiled and adopted"
    it.invoke()  # the compiled loop alone
    want = run_model(litert(), model, feeds)
    for g, w in zip(_outputs(it), want):
        assert_close(g, w)


def test_the_corpus_keras3_lstm_loop_is_compiled():
    path = MODELS_DIR / "lstm_small_keras3_while.tflite"
    if not path.exists():
        pytest.skip("corpus model absent")
    x = np.random.default_rng(0).uniform(-1, 1, (1, 16, 32)).astype(np.float32)
    it = _interp(path, [x])
    it.invoke()
    loop = _slot(it).get()
    assert loop is not None and loop.failed is None and loop.checked
    for _ in range(2):
        it.invoke()
    assert_close(_outputs(it)[0], run_model(litert(), path, [x])[0])


def test_a_loop_with_an_op_without_emitter_stays_interpreted(caplog):
    model, feeds = while_model(np.random.default_rng(3), float_cond=True)  # SUM in the cond
    with caplog.at_level(logging.DEBUG, logger="tflgpu"):
        it = _interp(model, feeds)
        it.invoke()
    assert _slot(it).get() is None
    assert "no emitter for SUM" in caplog.text
    for g, w in zip(_outputs(it), run_model(litert(), model, feeds)):
        assert_close(g, w)


def test_an_index_out_of_range_raises_the_interpreted_error():
    model, feeds = while_model(np.random.default_rng(3), static_counter=False)
    it = _interp(model, [feeds[0], np.array(-3, np.int32)])  # cond -3 < 5 holds; GATHER row -3 does not exist
    with pytest.raises(RuntimeError, match="GATHER: index out of range"):
        it.invoke()
    it.set_tensor(it.get_input_details()[1]["index"], np.array(0, np.int32))
    it.invoke()  # the same interpreter goes on, compiled
    assert _slot(it).get().failed is None
    for g, w in zip(_outputs(it), run_model(litert(), model, [feeds[0], np.array(0, np.int32)])):
        assert_close(g, w)


def test_a_compiled_loop_giving_other_numbers_is_not_adopted(monkeypatch, caplog):
    """The first compiled run is checked against the interpreted one: a wrong emitter is caught, logged, and the
    interpreted result is what the user gets."""
    monkeypatch.setitem(loops._BINARY, "MUL", "({a} * {b} * np.float32(1.01))")
    model, feeds = while_model(np.random.default_rng(3))
    with caplog.at_level(logging.WARNING, logger="tflgpu"):
        it = _interp(model, feeds)
        it.invoke()
    assert "results differ from the interpreted loop's" in caplog.text
    assert _slot(it).get().failed is not None
    it.invoke()
    for g, w in zip(_outputs(it), run_model(litert(), model, feeds)):
        assert_close(g, w)


def test_background_compile_serves_interpreted_runs_until_ready(monkeypatch):
    monkeypatch.setenv("TFLGPU_CPU_LOOPS", "background")
    model, feeds = while_model(np.random.default_rng(5))
    it = _interp(model, feeds)
    it.invoke()  # interpreted (the compile starts now, on a thread)
    first = [o.copy() for o in _outputs(it)]
    assert it.wait_background(timeout=120)
    it.invoke()
    it.invoke()
    loop = _slot(it).get()
    assert loop.failed is None and loop.checked
    for g, w in zip(_outputs(it), first):
        assert_close(g, w)


def test_interpreted_runs_hand_the_compile_thread_the_gil(monkeypatch, tmp_path):
    """While its compile thread runs, each interpreted run of the loop gives up the GIL once (time.sleep(0)), so
    that a thread invoking back to back does not starve the compile; none once it is compiled."""
    monkeypatch.setenv("TFLGPU_CPU_LOOPS", "background")
    monkeypatch.setenv("TFLGPU_CACHE_DIR", str(tmp_path))  # (nothing compiled yet: the compile takes a while)
    _forget_loaded_loops()  # (nor in this process: an earlier test's loop of the same code would load at once)
    yields, real_sleep = [], loops.time.sleep
    monkeypatch.setattr(loops.time, "sleep", lambda s: yields.append(s) or real_sleep(s))
    model, feeds = while_model(np.random.default_rng(7))
    it = _interp(model, feeds)
    it.invoke()  # (starts the compile)
    loop = _slot(it).get()
    for _ in range(5):  # (a compile from nothing takes seconds, these runs a few milliseconds)
        it.invoke()
    assert loop._thread.is_alive() or loop._fn is not None
    assert yields.count(0) >= 4  # (the last run may find the compile done)
    assert it.wait_background(timeout=120)
    it.invoke()
    done = len(yields)
    it.invoke()
    assert len(yields) == done and loop.failed is None


def test_off_keeps_every_loop_interpreted(monkeypatch):
    monkeypatch.setenv("TFLGPU_CPU_LOOPS", "off")
    model, feeds = while_model(np.random.default_rng(3))
    it = _interp(model, feeds)
    it.invoke()
    assert _slot(it).get() is None


def test_a_damaged_stored_loop_is_compiled_again(tmp_path, monkeypatch):
    """The generated source and numba's cache files live in the cache's cpu_code directory; garbage there costs a
    compile, never a failure."""
    monkeypatch.setenv("TFLGPU_CACHE_DIR", str(tmp_path))
    _forget_loaded_loops()  # (the same source may have been loaded by an earlier test, from another directory)
    model, feeds = while_model(np.random.default_rng(7))
    it = _interp(model, feeds)
    it.invoke()
    stored = sorted((tmp_path / "cpu_code").rglob("tflgpu_loop_*"))
    assert any(p.suffix == ".py" for p in stored) and any(p.suffix == ".nbi" for p in stored), stored
    for p in stored:
        p.write_bytes(b"\x00garbage")
    _forget_loaded_loops()
    it2 = _interp(model, feeds)
    it2.invoke()
    assert _slot(it2).get().failed is None and _slot(it2).get().checked
    for g, w in zip(_outputs(it2), _outputs(it)):
        assert_close(g, w)


def test_an_unusable_code_directory_compiles_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TFLGPU_CACHE_DIR", str(blocker))
    model, feeds = while_model(np.random.default_rng(9))
    it = _interp(model, feeds)
    it.invoke()
    assert _slot(it).get().failed is None and _slot(it).get().checked


def test_a_full_disk_leaves_no_partial_source_and_compiles_in_memory(tmp_path, monkeypatch):
    """A loop's generated source that a full disk cuts short is removed (it took the space a later write needs),
    and the loop compiles in memory, matching LiteRT."""
    import errno
    import pathlib

    monkeypatch.setenv("TFLGPU_CACHE_DIR", str(tmp_path))
    _forget_loaded_loops()
    write_text = pathlib.Path.write_text

    def full(self, data, *args, **kw):
        if self.suffix == ".tmp":
            write_text(self, data[: len(data) // 2], *args, **kw)
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, data, *args, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    model, feeds = while_model(np.random.default_rng(11))
    it = _interp(model, feeds)
    it.invoke()
    loop = _slot(it).get()
    assert loop is not None and loop.failed is None and loop.checked
    assert not list(tmp_path.rglob("*.tmp")), list(tmp_path.rglob("*"))
    it.invoke()
    for g, w in zip(_outputs(it), run_model(litert(), model, feeds)):
        assert_close(g, w)
