"""Built plans and tuning records as flatbuffers payloads (schema: ``schema/cache.fbs``)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import xxhash

from ..graph.precision import PrecisionChoice
from .fb import Plan as fb_plan
from .fb import PlanStep as fb_step
from .fb import Shape as fb_shape
from .fb import Tuning as fb_tuning
from .records import TuningRecord, params_from_json, params_to_json
from .store import InvalidEntry

log = logging.getLogger("tflgpu")

MAX_TOKEN_LEN = 128


def model_token(data) -> str:
    """The default model token: a 64-bit xxhash fingerprint of the model bytes, in hex (farmhash-style)."""
    return xxhash.xxh64_hexdigest(memoryview(data))


def check_token(token: str) -> str:
    """A user-given model token is used as-is, if it is a plain, bounded name (it becomes part of file keys)."""
    if not isinstance(token, str) or not token:
        raise ValueError("model_token must be a non-empty string")
    if len(token) > MAX_TOKEN_LEN:
        raise ValueError(f"model_token is longer than {MAX_TOKEN_LEN} characters")
    bad = set(token) - set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    if bad or token in (".", ".."):
        raise ValueError(f"model_token may hold letters, digits, '.', '_' and '-' only; got {token!r}")
    return token


def plan_key(token: str, options: str, input_shapes) -> str:
    """File key of a plan: the model token (readable, for ``tflgpu cache clear --model``) + options hash."""
    h = xxhash.xxh64_hexdigest(f"{options}|{[tuple(s) for s in input_shapes]}".encode())
    return f"{token}-{h}"


@dataclass
class StepRecord:
    op_index: int
    on_device: bool
    params: dict
    reason: str = ""


@dataclass
class PlanRecord:
    model_token: str
    options: str
    input_shapes: list[tuple[int, ...]]
    tensor_shapes: list[tuple[int, ...]]
    steps: list[StepRecord] = field(default_factory=list)
    program_key: str = ""
    model_name: str = ""  # the model file's name when the plan was built ("" for a model given as bytes)
    precision: PrecisionChoice = field(default_factory=PrecisionChoice)  # an FP16 plan's ops kept in FP32


def _params_json(params: dict) -> str:
    return json.dumps(params_to_json(params), sort_keys=True)


def _params_from(s: bytes | None) -> dict:
    d = json.loads((s or b"{}").decode())
    if not isinstance(d, dict):
        raise InvalidEntry("step parameters are not a mapping")
    return params_from_json(d)


def _shapes(b: flatbuffers.Builder, shapes) -> int:
    offs = []
    for s in shapes:
        dims = b.CreateNumpyVector(np.asarray(s, np.int32))
        fb_shape.Start(b)
        fb_shape.AddDims(b, dims)
        offs.append(fb_shape.End(b))
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def encode_plan(rec: PlanRecord) -> bytes:
    b = flatbuffers.Builder(4096)
    steps = []
    for s in rec.steps:
        pj, reason = b.CreateString(_params_json(s.params)), b.CreateString(s.reason)
        fb_step.Start(b)
        fb_step.AddOpIndex(b, s.op_index)
        fb_step.AddOnDevice(b, s.on_device)
        fb_step.AddParamsJson(b, pj)
        fb_step.AddReason(b, reason)
        steps.append(fb_step.End(b))
    b.StartVector(4, len(steps), 4)
    for o in reversed(steps):
        b.PrependUOffsetTRelative(o)
    steps_vec = b.EndVector()
    ins, tens = _shapes(b, rec.input_shapes), _shapes(b, rec.tensor_shapes)
    fp32_ops = b.CreateNumpyVector(np.asarray(list(rec.precision.fp32), np.int32))
    reasons = [b.CreateString(why) for why in rec.precision.fp32.values()]
    b.StartVector(4, len(reasons), 4)
    for o in reversed(reasons):
        b.PrependUOffsetTRelative(o)
    reasons_vec = b.EndVector()
    tok, opt, prog, name = (b.CreateString(x) for x in (rec.model_token, rec.options, rec.program_key,
                                                         rec.model_name))
    fb_plan.Start(b)
    fb_plan.AddModelToken(b, tok)
    fb_plan.AddOptions(b, opt)
    fb_plan.AddInputShapes(b, ins)
    fb_plan.AddTensorShapes(b, tens)
    fb_plan.AddSteps(b, steps_vec)
    fb_plan.AddProgramKey(b, prog)
    fb_plan.AddModelName(b, name)
    fb_plan.AddFp32Ops(b, fp32_ops)
    fb_plan.AddFp32Reasons(b, reasons_vec)
    fb_plan.AddFp16Error(b, rec.precision.error)
    b.Finish(fb_plan.End(b))
    return bytes(b.Output())


def decode_plan(data: bytes) -> PlanRecord:
    try:
        p = fb_plan.Plan.GetRootAs(data, 0)

        def shapes(n, get):
            out = []
            for i in range(n):
                shape = get(i)  # (one accessor object per shape: each lookup walks the vtable again)
                out.append(tuple(shape.DimsAsNumpy().tolist()) if shape.DimsLength() else ())
            return out

        rec = PlanRecord((p.ModelToken() or b"").decode(), (p.Options() or b"").decode(),
                         shapes(p.InputShapesLength(), p.InputShapes), shapes(p.TensorShapesLength(), p.TensorShapes),
                         [], (p.ProgramKey() or b"").decode(), (p.ModelName() or b"").decode())
        for i in range(p.StepsLength()):
            s = p.Steps(i)
            rec.steps.append(StepRecord(s.OpIndex(), bool(s.OnDevice()), _params_from(s.ParamsJson()),
                                        (s.Reason() or b"").decode()))
        ops = p.Fp32OpsAsNumpy().tolist() if p.Fp32OpsLength() else []
        if len(ops) != p.Fp32ReasonsLength():
            raise InvalidEntry("its FP32 ops and their reasons do not pair up")
        rec.precision = PrecisionChoice({int(o): (p.Fp32Reasons(i) or b"").decode() for i, o in enumerate(ops)},
                                        p.Fp16Error())
    except InvalidEntry:
        raise
    except Exception as e:  # a payload that passed the checksum but not the schema (a foreign writer)
        raise InvalidEntry(f"plan payload unreadable ({type(e).__name__})") from e
    return rec


def encode_tuning(rec) -> bytes:
    b = flatbuffers.Builder(512)
    op, pj, family = b.CreateString(rec.op), b.CreateString(_params_json(rec.params)), b.CreateString(rec.family)
    shape = b.CreateNumpyVector(np.asarray(rec.shape, np.int32))
    fb_tuning.Start(b)
    fb_tuning.AddOp(b, op)
    fb_tuning.AddParamsJson(b, pj)
    fb_tuning.AddDefaultUs(b, rec.default_us)
    fb_tuning.AddBestUs(b, rec.best_us)
    fb_tuning.AddTrials(b, rec.trials)
    fb_tuning.AddGeneratorVersion(b, rec.generator_version)
    fb_tuning.AddUpdated(b, rec.updated or time.time())
    fb_tuning.AddFamily(b, family)
    fb_tuning.AddShape(b, shape)
    b.Finish(fb_tuning.End(b))
    return bytes(b.Output())


def decode_tuning(data: bytes) -> TuningRecord:
    try:
        t = fb_tuning.Tuning.GetRootAs(data, 0)
        return TuningRecord(_params_from(t.ParamsJson()), t.DefaultUs(), t.BestUs(), t.Trials(),
                            (t.Op() or b"").decode(), t.GeneratorVersion(), t.Updated(), (t.Family() or b"").decode(),
                            tuple(int(v) for v in t.ShapeAsNumpy()) if t.ShapeLength() else ())
    except InvalidEntry:
        raise
    except Exception as e:
        raise InvalidEntry(f"tuning payload unreadable ({type(e).__name__})") from e


class PlanCache:
    """Built plans of one model (token) under one set of plan options, in a CacheStore."""

    def __init__(self, store, token: str, options: str, model_name: str = ""):
        self.store, self.token, self.options, self.model_name = store, token, options, model_name

    def load(self, input_shapes, device_key: str, tensor_count: int) -> PlanRecord | None:
        """The stored plan for these input shapes on this device, or None (an unusable one is discarded)."""
        key = plan_key(self.token, self.options, input_shapes)
        payload = self.store.get("plan", key, device_key)
        if payload is None:
            return None
        try:
            rec = decode_plan(payload)
            if (rec.model_token, rec.options) != (self.token, self.options):
                raise InvalidEntry("belongs to another model or options")
            if [tuple(s) for s in rec.input_shapes] != [tuple(s) for s in input_shapes]:
                raise InvalidEntry("built for other input shapes")
            if len(rec.tensor_shapes) != tensor_count:
                raise InvalidEntry("its tensor count does not match the model")
        except InvalidEntry as e:
            self.store.discard(self.store.path("plan", key, device_key), str(e))
            return None
        return rec

    def reject(self, record: PlanRecord, device_key: str, why: str) -> None:
        """Drop a plan ``load`` returned that turned out unusable; the caller builds a new one."""
        self.store.discard(self.store.path("plan", plan_key(self.token, self.options, record.input_shapes),
                                           device_key), why)

    def save(self, steps: list[StepRecord], input_shapes, tensor_shapes, program: str, device_key: str,
             precision: PrecisionChoice | None = None) -> None:
        """Store a built plan: its steps, the shapes it was built for, its program's key and (FP16) the ops it
        keeps in FP32."""
        rec = PlanRecord(self.token, self.options, [tuple(s) for s in input_shapes],
                         [tuple(s) for s in tensor_shapes], steps, program, self.model_name,
                         precision or PrecisionChoice())
        try:
            self.store.put("plan", plan_key(self.token, self.options, input_shapes), device_key, encode_plan(rec))
        except OSError as e:
            log.warning("tflgpu cache: could not store the plan: %s", e)
