"""The tflgpu command line, and the bundled default model."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from tflgpu import GpuDelegate, Interpreter
from tflgpu.cli import main
from tflgpu.model.builder import ModelBuilder
from tflgpu.model.default_model import DEFAULT_MODEL_PATH, build_default_model

from .conftest import assert_close, corpus_model, litert, run_model


def test_shipped_default_model_is_what_the_builder_makes():
    assert DEFAULT_MODEL_PATH.read_bytes() == build_default_model()
    assert DEFAULT_MODEL_PATH.stat().st_size < 400_000


def test_default_model_matches_litert():
    x = np.random.default_rng(3).uniform(-1, 1, (1, 96, 96, 3)).astype(np.float32)
    got = run_model(Interpreter, DEFAULT_MODEL_PATH, [x])[0]
    want = run_model(litert(), DEFAULT_MODEL_PATH, [x])[0]
    assert_close(got, want)
    assert abs(float(got.sum()) - 1.0) < 1e-5


def test_run_default_model(capsys):
    assert main(["run", "--repeat", "2", "--delegate", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "default.tflite" in out and "device:  cpu (numba)" in out
    assert "output:  probs float32[1, 10]" in out and "latency: median" in out


def test_run_defaults_to_the_opencl_device(capsys, opencl_device):
    assert main(["run", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert f"device:  opencl: {opencl_device.identity.platform}" in out and "0 on cpu" in out


def test_run_with_input_file_and_save(tmp_path, capsys):
    x = np.random.default_rng(0).uniform(-1, 1, (1, 96, 96, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(DEFAULT_MODEL_PATH), "--input", str(tmp_path / "x.npy"), "--repeat", "1",
                 "--save", str(tmp_path)]) == 0
    saved = list(tmp_path.glob("output_*.npy"))
    assert len(saved) == 1
    assert_close(np.load(saved[0]), run_model(litert(), DEFAULT_MODEL_PATH, [x])[0])


def test_run_rejects_wrong_input_count(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((1, 96, 96, 3), np.float32))
    assert main(["run", "--input", str(tmp_path / "x.npy"), "--input", str(tmp_path / "x.npy")]) == 2


def test_run_bad_model_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model at all")
    assert main(["run", str(bad)]) == 1
    assert "error: The model is not a valid Flatbuffer" in capsys.readouterr().err


def test_inspect_json(capsys):
    path = corpus_model("fallback_ops.tflite")
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ops"]["TOPK_V2"] == {"count": 1, "cpu": True, "opencl": True}
    assert report["ops"]["CONV_2D"] == {"count": 3, "cpu": True, "opencl": True}
    assert [o["name"] for o in report["outputs"]] == ["PartitionedCall:2", "PartitionedCall:0", "PartitionedCall:1"]


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "tflgpu.cli", "inspect", str(DEFAULT_MODEL_PATH)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "CONV_2D" in r.stdout and "HARD_SWISH" in r.stdout


def test_inspect_devices_and_memory(capsys, opencl_device):
    assert main(["inspect", "--devices"]) == 0
    assert opencl_device.identity.device in capsys.readouterr().out
    assert main(["inspect", str(DEFAULT_MODEL_PATH), "--memory"]) == 0
    out = capsys.readouterr().out
    assert "planned:" in out and "shared buffers" in out


def test_inspect_passes(capsys, opencl_device):
    assert main(["inspect", str(corpus_model("mobilenet_v1_1.0_224_fp16.tflite")), "--passes"]) == 0
    out = capsys.readouterr().out
    assert "fold_constants       56 op(s)" in out  # the float16 weights' DEQUANTIZE ops
    assert "fuse_elementwise" in out and "cull_dead" in out


def test_run_and_bench_through_gpu_delegate(capsys, opencl_device):
    assert main(["run", "--delegate", "gpu", "--repeat", "2"]) == 0
    assert "device:  opencl:" in capsys.readouterr().out
    assert main(["bench", "--delegate", "gpu", "--repeat", "3", "--warmup", "1", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "| default.tflite | opencl:" in out and "per-kernel profile" in out and "| conv_2d_0 | CONV_2D |" in out


def test_bench_alternates_tflgpu_and_litert(monkeypatch):
    """`tflgpu bench` times tflgpu and LiteRT in alternating blocks (the machine's drift hits both alike), not
    in one block each: the order of timed invokes is recorded on both interpreters."""
    from tflgpu import benchmark
    from tflgpu.model.default_model import DEFAULT_MODEL_PATH

    order: list[str] = []
    real = benchmark.interleaved_samples

    def recording(interps, *a, **kw):
        for name, it in zip(("tflgpu", "litert"), interps):
            inner = it.invoke
            it.invoke = lambda inner=inner, name=name: (order.append(name), inner())[1]
        return real(interps, *a, **kw)

    monkeypatch.setattr(benchmark, "interleaved_samples", recording)
    row = benchmark.bench_model(DEFAULT_MODEL_PATH, warmup=1, repeats=6)
    assert row.litert_ms is not None and row.min_ms <= row.tflgpu_ms <= row.max_ms
    runs = [order[0]]  # the runs of one runtime in a row
    for name in order[1:]:
        if name != runs[-1]:
            runs.append(name)
    assert len(runs) >= 6, runs  # warm-up of each, then at least two blocks of each, alternating


def test_arguments_are_checked_before_any_work(tmp_path, capsys, monkeypatch):
    """--repeat 0, a missing model among several, an unusable --save: refused at once, naming the argument
    (nothing is built or run: Interpreter construction would fail the test)."""
    import tflgpu.interpreter

    def no_work(*a, **kw):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(tflgpu.interpreter.Interpreter, "__init__", no_work)
    for argv in (["run", "--repeat", "0"], ["bench", "--repeat", "0"], ["bench", "--warmup", "-1"],
                 ["run", "--threads", "x"], ["warmup", "m.tflite", "--trials", "0"],
                 ["warmup", "m.tflite", "--budget-s", "0"], ["warmup", "m.tflite", "--budget-s", "x"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and any(w in err for w in ("must be at least", "is not a", "must be positive")), err
    assert main(["bench", str(DEFAULT_MODEL_PATH), str(tmp_path / "missing.tflite")]) == 1
    assert f"model file not found: {tmp_path / 'missing.tflite'}" in capsys.readouterr().err
    url = "https://example.com/models/m.tflite"  # (a path would have read it as https:/example.com/...)
    for argv in (["run", url], ["inspect", url], ["inspect", "--memory", url], ["bench", url],
                 ["tune", url], ["warmup", url]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert f"not URLs: download the model first (curl -LO {url}) and pass the file's path" in err, (argv, err)
    (tmp_path / "file").write_text("")
    assert main(["run", "--save", str(tmp_path / "file" / "out")]) == 1
    assert f"--save {tmp_path / 'file' / 'out'}: cannot create the directory" in capsys.readouterr().err


def test_save_creates_its_directory_and_verbose_goes_anywhere(tmp_path, capsys):
    out = tmp_path / "new" / "outputs"
    assert main(["run", "--delegate", "cpu", "--repeat", "1", "--save", str(out), "-v"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["output_" + f"{i}.npy" for i in
                                                     [d["index"] for d in Interpreter(str(DEFAULT_MODEL_PATH)).get_output_details()]]
    model = str(DEFAULT_MODEL_PATH)
    assert main(["-v", "inspect", model]) == 0 and main(["inspect", model, "-v"]) == 0


def test_version(capsys):
    from tflgpu.version import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tflgpu {__version__}"


def test_python_dash_m_tflgpu_is_the_command(tmp_path):
    """``python -m tflgpu`` runs the command (where the environment's scripts directory is not on PATH): its
    version, and an error's line and status."""
    from tflgpu.version import __version__

    r = subprocess.run([sys.executable, "-m", "tflgpu", "--version"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert (r.returncode, r.stdout.strip()) == (0, f"tflgpu {__version__}"), r.stderr
    r = subprocess.run([sys.executable, "-m", "tflgpu", "inspect", str(tmp_path / "missing.tflite")],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and r.stderr.strip() == f"error: model file not found: {tmp_path / 'missing.tflite'}"


def test_device_named_by_the_environment_must_exist(monkeypatch, opencl_device):
    """TFLGPU_DEVICE names a device as GpuDelegate(device=...) does: one that does not exist is an error
    naming the variable, not a warning and a quiet run on the CPU kernels."""
    from tflgpu import GpuDelegate

    monkeypatch.setenv("TFLGPU_DEVICE", "no-such-device")
    with pytest.raises(ValueError, match=r"TFLGPU_DEVICE='no-such-device': no OpenCL device matches 'no-such-device'"):
        Interpreter(str(DEFAULT_MODEL_PATH), delegate=GpuDelegate(cache=False))
    assert main(["run", "--repeat", "1"]) == 1


def test_input_of_another_shape_is_refused_unless_resize(tmp_path, capsys):
    x = np.random.default_rng(0).uniform(-1, 1, (2, 96, 96, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", "--delegate", "cpu", "--repeat", "1", "--input", str(tmp_path / "x.npy")]) == 1
    assert "has shape [2, 96, 96, 3], the model's input 'input' [1, 96, 96, 3]: pass --resize" in capsys.readouterr().err
    assert main(["run", "--delegate", "cpu", "--repeat", "1", "--resize", "--input", str(tmp_path / "x.npy"),
                 "--save", str(tmp_path / "out")]) == 0
    got = np.load(next((tmp_path / "out").iterdir()))
    assert got.shape[0] == 2
    assert_close(got, run_model(litert(), DEFAULT_MODEL_PATH, [x])[0])
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    assert main(["run", "--input", str(tmp_path / "bad.npy")]) == 1
    assert f"--input {tmp_path / 'bad.npy'}: cannot read it as a .npy array" in capsys.readouterr().err


def test_input_files_that_are_not_the_model_s_input_say_what_to_change(tmp_path, capsys):
    """Each --input file that cannot be the model's input as it is fails before the model runs, with what to do: a
    wrong type (a quantized input's scale and zero point named), a missing batch dimension, another rank, an .npz
    archive, a file that is no .npy at all (numpy's own words speak of pickled data). A big-endian file of the right
    type runs as its values."""
    x = np.random.default_rng(0).uniform(-1, 1, (1, 96, 96, 3)).astype(np.float32)
    cases = {"f64.npy": (x.astype(np.float64), "holds float64, the model's input 'input' takes float32: save it as "
                                              "float32 (x.astype(numpy.float32))"),
             "hwc.npy": (x[0], "has shape [96, 96, 3], the model's input 'input' [1, 96, 96, 3]: add the batch "
                               "dimension (save x[None])"),
             "rank5.npy": (x[None], "save it with 4 dimensions"),
             "x.npz": (None, "it is an .npz archive: pass one .npy file per model input"),
             "text.npy": (None, "it is not a .npy file, which starts with NumPy's magic string")}
    np.savez(tmp_path / "x.npz", x=x)
    (tmp_path / "text.npy").write_text("0.5, 0.25\n")
    for name, (array, said) in cases.items():
        if array is not None:
            np.save(tmp_path / name, array)
        for resize in ([], ["--resize"]):
            assert main(["run", "--delegate", "cpu", "--repeat", "1", *resize, "--input", str(tmp_path / name)]) == 1
            assert said in capsys.readouterr().err, (name, resize)
    np.save(tmp_path / "big.npy", x.astype(">f4"))
    assert main(["run", "--delegate", "cpu", "--repeat", "1", "--input", str(tmp_path / "big.npy"),
                 "--save", str(tmp_path / "out")]) == 0
    assert_close(np.load(next((tmp_path / "out").iterdir())), run_model(litert(), DEFAULT_MODEL_PATH, [x])[0])
    b = ModelBuilder()
    q = b.input("q", (1, 4), np.int8, quant={"scale": np.float32([0.5]), "zero_point": np.int64([-3])})
    y = b.tensor("y", (1, 4), np.float32)
    b.op("DEQUANTIZE", [q], [y])
    b.output(y)
    (tmp_path / "q.tflite").write_bytes(b.build())
    np.save(tmp_path / "q.npy", np.zeros((1, 4), np.float32))
    assert main(["run", "--repeat", "1", "--input", str(tmp_path / "q.npy"), str(tmp_path / "q.tflite")]) == 1
    assert "takes int8, quantized: save numpy.round(x / 0.5) - 3 as int8" in capsys.readouterr().err
    b = ModelBuilder()  # (a string input takes any numpy strings, as set_tensor does)
    s = b.input("s", (2,), np.object_, type_name="STRING")
    y = b.tensor("y", (1, 2), np.object_, type_name="STRING")
    b.op("RESHAPE", [s, b.const("shape", np.array([1, 2], np.int32))], [y])
    b.output(y)
    (tmp_path / "s.tflite").write_bytes(b.build())
    np.save(tmp_path / "s.npy", np.array([b"ab", b"cde"]))
    assert main(["run", "--repeat", "1", "--input", str(tmp_path / "s.npy"), str(tmp_path / "s.tflite")]) == 0
    assert "[b'ab', b'cde']" in capsys.readouterr().out


def test_a_dynamic_input_stored_too_small_runs_at_the_given_shape(tmp_path, capsys, rng):
    """A model whose dynamic input is stored at a size it cannot run (oputil.stored_too_small_model) runs at the
    --input array's shape with --resize, resized before the first allocation; without them the error says how.
    tflgpu bench takes the shape as --input-shape."""
    from .oputil import stored_too_small_model

    model = tmp_path / "dynamic.tflite"
    model.write_bytes(stored_too_small_model(rng))
    x = rng.uniform(-1, 1, (1, 9, 7, 1)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", "--repeat", "1", str(model)]) == 1
    assert "stored as [1, 1, 1, 1]" in (err := capsys.readouterr().err) and "--input FILE.npy --resize" in err
    assert main(["run", "--repeat", "1", "--input", str(tmp_path / "x.npy"), str(model)]) == 1
    assert "pass --resize" in capsys.readouterr().err
    assert main(["run", "--repeat", "1", "--resize", "--input", str(tmp_path / "x.npy"), "--save", str(tmp_path / "out"),
                 str(model)]) == 0
    got = np.load(next((tmp_path / "out").iterdir()))
    assert got.shape == (1, 7, 5, 4)
    assert_close(got, run_model(litert(), model, [x])[0])
    # tflgpu bench at the shape given (beside LiteRT, resized alike), with its profile; a count that does not fit
    assert main(["bench", "--repeat", "2", "--warmup", "0", "--input-shape", "1,9,7,1", "--profile", str(model)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| dynamic.tflite"))
    assert float(row.split("|")[-2]) < 1e-4  # (max rel err against LiteRT)
    assert main(["bench", "--repeat", "2", "--input-shape", "1,9,7,1", "--input-shape", "2", str(model)]) == 1
    assert "2 input shapes given for the model's 1 inputs" in capsys.readouterr().err
    # the commands that plan the model at its stored shapes say why they cannot (they said "no OpenCL device")
    # and which option plans it at another: --input-shape, with which they run, and warmup stores the plan that the
    # model's caller (resized alike, default options) then starts from
    cache = tmp_path / "cache"
    for command in (["inspect", "--memory"], ["inspect", "--passes"], ["inspect", "--startup"],
                    ["tune", "--mode", "fast", "--trials", "1"], ["warmup", "--cache-dir", str(cache)]):
        assert main([command[0], str(model), *command[1:]]) == 1, command
        out = capsys.readouterr()
        said = out.out + out.err
        assert "stored as [1, 1, 1, 1]" in said and "no OpenCL device" not in said, command
        assert "pass --input-shape D,D,... (once per input)" in said, command
        assert main([command[0], str(model), *command[1:], "--input-shape", "1,9,7,1"]) == 0, command
        capsys.readouterr()
    it = Interpreter(str(model), delegate=GpuDelegate(serialization_dir=cache, tuning="background"))
    it.resize_tensor_input(it.get_input_details()[0]["index"], [1, 9, 7, 1])
    it.allocate_tensors()
    assert it.gpu_plan.build_stats["plan"] == "cache" and it.gpu_plan.build_stats["source_builds"] == 0


def test_gpu_only_options_with_the_cpu_delegate_say_they_are_ignored(capsys):
    assert main(["run", "--delegate", "cpu", "--repeat", "1", "--precision", "fp16"]) == 0
    assert "note: with --delegate cpu, --precision fp16 is ignored (options of the GPU delegate)" in capsys.readouterr().err
    assert main(["bench", "--delegate", "cpu", "--repeat", "2", "--warmup", "0", "--profile", "--no-compare"]) == 0
    assert "note: with --delegate cpu, --profile is ignored" in capsys.readouterr().err


def test_bench_output_has_no_litert_log_lines():
    r = subprocess.run([sys.executable, "-m", "tflgpu.cli", "bench", "--delegate", "cpu", "--repeat", "2", "--warmup", "0"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| default.tflite |" in r.stdout
    assert "INFO: Created TensorFlow Lite" not in r.stdout + r.stderr


def test_run_and_bench_share_one_thread_default_and_show_it(capsys):
    import os

    n = os.cpu_count()
    assert main(["run", "--delegate", "cpu", "--repeat", "1"]) == 0
    assert f"; {n} CPU threads" in capsys.readouterr().out
    assert main(["bench", "--delegate", "cpu", "--repeat", "2", "--warmup", "0", "--no-compare"]) == 0
    assert f"{n} CPU threads for tflgpu's CPU kernels and LiteRT alike" in capsys.readouterr().out


def test_warmup_shows_kernels_and_names_each_warning(tmp_path, rng, opencl_device, monkeypatch, capsys):
    """The bar moves per kernel tuned (the model and its kernels done of total), and a warning raised while a
    model warms up is printed after the bar, with the model's name, not in the middle of it; --trials and
    --budget-s are the search's."""
    import logging

    import tflgpu.runtime.plan as plan_mod
    import tflgpu.runtime.tuning as tuning_mod

    from .oputil import conv_model

    path = tmp_path / "conv.tflite"
    path.write_bytes(conv_model(rng)[0])
    real = plan_mod.transform_graph

    def warning_then_transform(*a, **k):
        logging.getLogger("tflgpu").warning("something the user should know")
        return real(*a, **k)

    monkeypatch.setattr(plan_mod, "transform_graph", warning_then_transform)
    searches, real_search = [], tuning_mod.tune_tasks

    def search(tasks, bench, device_key, config):
        searches.append((config.kernel_trials(), config.model_budget()))
        return real_search(tasks, bench, device_key, config)

    monkeypatch.setattr(tuning_mod, "tune_tasks", search)
    monkeypatch.setenv("TFLGPU_TUNING", "")
    assert main(["warmup", str(path), "--tuning", "fast", "--trials", "2", "--budget-s", "9",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    assert searches == [(2, 9.0)]
    out, err = capsys.readouterr()
    assert "conv.tflite [fp32]: kernel 1/1 tuned" in err, err
    assert "something the user should know" not in err
    assert "conv.tflite [fp32]: warning: something the user should know" in out, out
    assert "best parameters searched for 1 kernels" in out and "not searched" not in out, out
    # a budget that runs out before the kernel is searched: said so (it was "searched for 1 kernels")
    assert main(["warmup", str(path), "--tuning", "fast", "--budget-s", "0.001", "-q",
                 "--cache-dir", str(tmp_path / "cache2")]) == 0
    out = capsys.readouterr().out
    assert "1 not searched: the budget ran out" in out and "best parameters searched" not in out, out


def test_warmup_jobs_relay_kernel_progress(tmp_path, rng, opencl_device):
    """With --jobs, worker processes send their per-kernel progress to the bar through a queue."""
    import os

    from .oputil import conv_model

    models = []
    for name in ("a.tflite", "b.tflite"):
        (tmp_path / name).write_bytes(conv_model(rng)[0])
        models.append(str(tmp_path / name))
    r = subprocess.run([sys.executable, "-m", "tflgpu.cli", "warmup", *models, "--jobs", "2", "--tuning", "fast",
                        "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TFLGPU_TUNING": ""}, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "a.tflite [fp32]: built" in r.stdout and "b.tflite [fp32]: built" in r.stdout, r.stdout
    assert "kernel 1/1 tuned" in r.stderr, r.stderr[-3000:]


def test_a_resized_model_is_profiled_and_prepared_after_its_optimized_build(tmp_path, rng, opencl_device,
                                                                           new_process):
    """A resized input's plan is built at allocate_tensors(), its optimized program in the background (a tiered
    start): the profile (`bench --profile`, `--trace`) and a bench's fresh interpreters wait for that build after
    the allocation, so what they time and show is the plan a user gets, not its quick tier."""
    from tflgpu.benchmark import _prepare, profiled_plan

    from .oputil import rand, stored_too_small_model

    model = tmp_path / "stored_small.tflite"
    model.write_bytes(stored_too_small_model(rng))
    delegate = GpuDelegate(tiered_compile=True, cache=False)
    plan = profiled_plan(model, delegate, input_shapes=[(1, 9, 7, 1)])
    assert plan is not None and plan.build_stats["tier"] == "optimized"
    it = _prepare(Interpreter, model, [rand(rng, (1, 12, 5, 1))], delegate=GpuDelegate(tiered_compile=True, cache=False))
    it.invoke()  # (a build the background finished is installed at the next invoke)
    assert it.gpu_plan.build_stats["tier"] == "optimized"


def test_bench_trace_is_a_chrome_trace_of_the_profiled_invoke(tmp_path, rng, opencl_device, capsys):
    """`bench --trace`: a Chrome/Perfetto trace whose kernel events are the profile's kernels, in order on one
    clock, with the CPU ops, copies and the device's idle time between kernels; and chrome_trace of a plan
    agrees with its profile_report, kernel for kernel."""
    from tflgpu import GpuDelegate, Interpreter
    from tflgpu.trace import chrome_trace

    from .oputil import CPU_OP, device_cpu_device_model, rand

    out = tmp_path / "traces" / "t.json"
    assert main(["bench", str(DEFAULT_MODEL_PATH), "--repeat", "2", "--warmup", "0", "--no-compare",
                 "--trace", str(out)]) == 0
    doc = json.loads(out.read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and len(kernels) == doc["otherData"]["kernels"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0 for e in doc["traceEvents"] if e["ph"] == "X")
    starts = [e["ts"] for e in kernels]
    assert starts == sorted(starts) and all(a["ts"] + a["dur"] <= b["ts"] + 1.0 for a, b in itertools.pairwise(kernels))
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(n.startswith("OpenCL: ") for n in names) and "host: CPU ops, copies" in names

    # a device ADD, a CPU step (oputil.cpu_op), a device ADD
    it = Interpreter(model_content=device_cpu_device_model(), delegate=GpuDelegate(profile=True, cache=False))
    assert it.gpu_plan.cpu_op_count == 1 and it.gpu_plan.gpu_op_count == 2
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], rand(rng, (1, 6, 6, 4)))
    it.invoke()
    doc = chrome_trace(it.gpu_plan)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    profile = it.gpu_plan.profile_report()
    assert sorted((e["name"], e["args"]["op"]) for e in kernels) == sorted((n, op) for n, op, _ in profile)
    assert sorted(e["dur"] for e in kernels) == pytest.approx(sorted(us for _, _, us in profile))
    host = [e for e in doc["traceEvents"] if e.get("cat") in ("cpu op", "upload", "download")]
    assert [e["name"] for e in host if e["cat"] == "cpu op"] == [f"{CPU_OP} (node 1)"]
    assert {e["cat"] for e in host} == {"cpu op", "upload", "download"}
    # the boundary's device commands: the ADD's output to dense NHWC and copied out for the CPU, the CPU step's
    # output copied in and to the slice layout; the device idles between the two while the CPU step runs (not
    # necessarily its longest gap: a step of a few microseconds, on a busy machine, is shorter than the host's
    # wake-ups)
    moved = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "transfer"]
    assert len(moved) == doc["otherData"]["transfers"] and {m.split(":")[0] for m in moved} >= {"copy out", "copy in"}
    idle = [e for e in doc["traceEvents"] if e.get("cat") == "gap"]
    assert len(kernels) == 2 and any(e["args"]["after"].startswith("copy out") and
                                     e["args"]["before"].startswith("copy in") and e["dur"] > 0 for e in idle)
    assert main(["bench", "--delegate", "cpu", "--trace", str(out)]) == 1
    assert "--trace records the OpenCL device's timeline: it needs --delegate gpu" in capsys.readouterr().err


def test_launch_stats_split_the_host_time_by_the_device_clock(opencl_device, tmp_path):
    """LaunchStats' split of (wall - kernels) on a model whose middle op runs on the CPU: the boundary tensors'
    copies and conversions are device commands of their own (transfer_us), the device is idle while the CPU op
    runs (between the copy out for it and the copy in of its result), and what is left is outside the device's
    span; the parts add up to the wall time."""
    from tflgpu import GpuDelegate
    from tflgpu.benchmark import launch_stats

    from .oputil import device_cpu_device_model

    path = tmp_path / "m.tflite"
    path.write_bytes(device_cpu_device_model())
    st = launch_stats(path, GpuDelegate(cache=False), repeats=5)
    assert st.launches == 2 and st.cpu_ops_us > 0 and st.transfer_us > 0
    assert st.span_us >= 0.9 * (st.kernel_us + st.transfer_us) and st.idle_us >= 0.9 * st.cpu_ops_us
    assert st.outside_us >= 0 and st.wall_us >= st.span_us
    text = st.breakdown()
    assert text.startswith(f"wall {st.wall_us:.0f} us = kernels") and "CPU ops" in text


def test_launch_stats_break_an_invoke_down(opencl_device):
    """benchmark.launch_stats (bench_corpus's second table): every launch counted, kernel time summed from the
    same run's events, the wall time at least that, the slowest kernels first with their rates; the flop counts
    behind GFLOP/s are the generators', the bytes behind GB/s the tensors' (slice layout) and constants'."""
    from tflgpu import GpuDelegate
    from tflgpu.benchmark import launch_stats, profiled_plan

    st = launch_stats(DEFAULT_MODEL_PATH, GpuDelegate(cache=False), repeats=3)
    plan = profiled_plan(DEFAULT_MODEL_PATH, GpuDelegate(cache=False))
    assert st.launches == len(plan.profile_report()) == sum(len(s.specs) for s in plan.steps if s.device == "gpu")
    assert st.wall_us >= 0.95 * st.kernel_us > 0 and st.cpu_ops_us == 0 and st.host_us_per_launch >= 0
    assert len(st.top) == 3 and [k.us for k in st.top] == sorted((k.us for k in st.top), reverse=True)
    convs = [k for k in st.top if k.op in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    assert convs and all(k.gflops and k.gflops > 0 and k.gbps > 0 for k in convs)
    first = next(s for s in plan.steps if s.device == "gpu")
    lay = first.specs[0]  # the stem conv: 96x96x3 in (one slice), 48x48x16 out, 16x3x3x3 weights + 16 biases
    assert lay.flops == 2 * 48 * 48 * 16 * 3 * 3 * 3


def test_bench_goes_on_past_a_model_litert_cannot_run(tmp_path, capsys):
    """A model with a MediaPipe custom op (which tflgpu runs and LiteRT's Python package cannot resolve) gets its
    tflgpu row and LiteRT's reason; the next model is still compared."""
    from .test_attention_ops import V2_MATRIX, _landmarks, _one_op, flex

    lm = _landmarks(np.random.default_rng(0), 15).reshape(1, 15, 3)
    model = tmp_path / "custom.tflite"
    model.write_bytes(_one_op("Landmarks2TransformMatrix", 2, flex(**V2_MATRIX), [lm], (1, 4, 4)))
    assert main(["bench", "--delegate", "cpu", "--repeat", "2", "--warmup", "0", str(model),
                 str(DEFAULT_MODEL_PATH)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| custom.tflite |"))
    assert row.endswith("| n/a | n/a | n/a |"), row
    assert "LiteRT could not run custom.tflite: " in out and "Landmarks2TransformMatrix" in out
    default = next(line for line in out.splitlines() if line.startswith("| default.tflite |"))
    assert "n/a" not in default, default


def main_not_interrupted(argv: list[str]) -> int:
    """main(argv), where a KeyboardInterrupt coming out of it fails the test (not the whole run)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt came out of main()")


def test_warmup_interrupted_reports_what_it_warmed(tmp_path, rng, opencl_device, monkeypatch, capsys):
    """Ctrl-C while a model warms up: the models warmed before are reported (they stay in the cache), the rest
    are named as not warmed, and the status is 130 without a traceback (before: KeyboardInterrupt's)."""
    from tflgpu import cli

    from .oputil import conv_model

    models = []
    for name in ("a.tflite", "b.tflite", "c.tflite"):
        (tmp_path / name).write_bytes(conv_model(rng)[0])
        models.append(str(tmp_path / name))
    real = cli._warm_one

    def interrupted_at_b(model, *args, **kw):
        if model.endswith("b.tflite"):
            raise KeyboardInterrupt
        return real(model, *args, **kw)

    monkeypatch.setattr(cli, "_warm_one", interrupted_at_b)
    assert main_not_interrupted(["warmup", *models, "--tuning", "none", "--cache-dir", str(tmp_path / "cache")]) == 130
    out, err = capsys.readouterr()
    assert "a.tflite [fp32]: built and stored" in out and "b.tflite" not in out and "c.tflite" not in out, out
    assert "interrupted: not warmed: b.tflite [fp32], c.tflite [fp32]" in err, err


def test_tune_interrupted_says_what_is_kept(tmp_path, monkeypatch, capsys):
    import tflgpu.tuning_report as report

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "tune_model", interrupted)
    monkeypatch.setenv("TFLGPU_CACHE_DIR", str(tmp_path / "cache"))
    assert main_not_interrupted(["tune", str(DEFAULT_MODEL_PATH), "-q"]) == 130
    err = capsys.readouterr().err
    assert err.strip().startswith("interrupted: the records of the models tuned before are stored") and \
        "continues the search from the trials it kept" in err, err


def test_warmup_jobs_stop_at_ctrl_c(tmp_path, opencl_device):
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it) during `warmup --jobs 2`: the
    workers stop the models they are warming and start no other, and the command ends with status 130 and one
    line, no traceback, no process left behind, and its cache directory reads clean. Before, the pool went on
    warming every queued model (70 s more for five), then printed tracebacks of the workers and the progress
    relay."""
    import os
    import signal
    import time

    from tflgpu.cache.store import CacheStore

    models = [str(corpus_model(n)) for n in ("mobilenet_v2_1.0_224.tflite", "mobilenet_v1_1.0_224.tflite",
                                             "posenet_mnv1_257.tflite", "deeplab_mnv2_257.tflite")]
    cache, err_path = tmp_path / "cache", tmp_path / "stderr.txt"
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from tflgpu.cli import main; sys.exit(main(sys.argv[1:]))")
    with open(err_path, "w") as err_file:
        p = subprocess.Popen([sys.executable, "-c", code, "warmup", *models, "--jobs", "2", "--tuning", "fast",
                              "--cache-dir", str(cache)], stdout=subprocess.DEVNULL, stderr=err_file,
                             start_new_session=True, env={**os.environ, "TFLGPU_TUNING": ""})
        deadline = time.monotonic() + 300
        while "tuned]" not in err_path.read_text() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # (until a worker is searching a kernel)
        assert p.poll() is None, err_path.read_text()[-3000:]
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=120)  # (a hang, not a speed: it ended in under a second here)
    err = err_path.read_text()
    assert p.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted: not warmed: " in err, err[-3000:]
    assert "deeplab_mnv2_257.tflite [fp32]" in err.rsplit("interrupted", 1)[1], err[-3000:]
    left = time.monotonic() + 30  # (multiprocessing's resource tracker ends once it reads its parent's exit)
    with pytest.raises(ProcessLookupError):  # none of its workers, nor its progress queue's manager, still runs
        while time.monotonic() < left:
            os.killpg(p.pid, 0)
            time.sleep(0.2)
    assert all(e.problem is None for e in CacheStore(cache).entries())


def test_warmup_and_tune_name_why_a_model_has_no_plan(tmp_path, opencl_device, capsys):
    """A model whose tensors have no elements at its shapes (an empty batch) has no device plan: warmup and tune say
    why, where they said "no OpenCL device" on a machine that has one. One whose data sizes a tensor (a WHERE's rows)
    has a plan, the WHERE's ops on the CPU (tests/test_data_sizes.py), and warms up."""
    from .test_ops_indexing import where_model

    b = ModelBuilder()
    x = b.input("x", [0, 5])
    y = b.tensor("y", [0, 5])
    b.op("ADD", [x, b.const("one", np.ones(1, np.float32))], [y])
    b.output(y)
    path = tmp_path / "empty.tflite"
    path.write_bytes(b.build())
    assert main(["warmup", str(path), "-q", "--cache-dir", str(tmp_path / "cache")]) != 0
    out, err = capsys.readouterr()
    assert "empty.tflite [fp32]: FAILED: no device plan: an empty batch" in out + err, out
    assert main(["tune", str(path), "--mode", "fast", "--trials", "1"]) != 0
    out, err = capsys.readouterr()
    assert "nothing to tune: an empty batch" in out + err and "no OpenCL device" not in out + err, out + err
    path = tmp_path / "where.tflite"
    path.write_bytes(where_model())
    assert main(["warmup", str(path), "-q", "--cache-dir", str(tmp_path / "cache")]) == 0
