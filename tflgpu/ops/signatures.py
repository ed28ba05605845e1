"""What an op's node must look like before any kernel sees it: input and output counts, which inputs may
be omitted, which tensors share a type, the ranks a kernel relies on. TFLite checks these in each kernel's
Prepare; here they are one table, checked once per op when a model is prepared (``problems``), so a
malformed node is refused with a message naming it instead of failing inside a kernel at invoke.

Adding a kernel: give its op an entry here (a test checks every registered CPU kernel has one); add type
groups and ranks where its kernels rely on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.ir import Operator, Subgraph

ANY = 1 << 30  # no upper bound on a count


@dataclass(frozen=True)
class Signature:
    inputs: tuple[int, int]  # (fewest, most) inputs
    outputs: tuple[int, int] = (1, 1)
    optional: frozenset[int] = frozenset()  # input positions that may be omitted (-1)
    same_type: tuple[str, ...] = ()  # e.g. ("in0", "in1", "out0"): these tensors share a type
    types: dict[str, frozenset[str]] = field(default_factory=dict)  # "in0"/"out0" -> allowed type names
    # "in0" -> (lowest, highest) rank; checked on constants and subgraph inputs, whose shapes are given
    ranks: dict[str, tuple[int, int]] = field(default_factory=dict)
    any_optional: bool = False  # every input may be omitted (LSTM's many optional tensors, control flow)
    nonempty: tuple[str, ...] = ()  # tensors that may not have a zero dimension (weights), where shapes are given
    inputs_alike: bool = False  # every input is of in0's type (a concatenation's, whatever their number)


_TABLE: dict[str, Signature] = {}

BOOL = frozenset({"BOOL"})
INDEX = frozenset({"INT32", "INT64"})
F32 = frozenset({"FLOAT32"})


def _add(names: str, inputs: int | tuple[int, int], outputs: int | tuple[int, int] = 1, **kw) -> None:
    ins = (inputs, inputs) if isinstance(inputs, int) else inputs
    outs = (outputs, outputs) if isinstance(outputs, int) else outputs
    kw["optional"] = frozenset(kw.get("optional", ()))
    for name in names.split():
        _TABLE[name] = Signature(ins, outs, **kw)


_UNARY_SAME = ("in0", "out0")
_add("ABS CEIL COS ELU EXP FLOOR GELU HARD_SWISH LEAKY_RELU LOG LOGISTIC NEG RELU RELU6 RELU_0_TO_1 "
     "RELU_N1_TO_1 ROUND RSQRT SIGN SIN SQRT SQUARE TANH ZEROS_LIKE ONES_LIKE L2_NORMALIZATION SOFTMAX "
     "LOG_SOFTMAX QUANT_SIM", 1, same_type=_UNARY_SAME)
_add("LOGICAL_NOT", 1, types={"in0": BOOL})
_COMPLEX = frozenset({"COMPLEX64", "COMPLEX128"})
_add("REAL IMAG COMPLEX_ABS", 1, types={"in0": _COMPLEX, "out0": frozenset({"FLOAT32", "FLOAT64"})})
_add("RFFT2D", 2, types={"in0": frozenset({"FLOAT32"}), "in1": frozenset({"INT32"}), "out0": frozenset({"COMPLEX64"})},
     ranks={"in0": (2, 16), "in1": (1, 1)})
_add("QUANTIZE DEQUANTIZE DENSIFY CAST", 1)
_add("SHAPE", 1, types={"out0": INDEX})
_add("RANK", 1)
_add("AVERAGE_POOL_2D MAX_POOL_2D L2_POOL_2D", 1, same_type=_UNARY_SAME, ranks={"in0": (4, 4)})
_add("MaxPoolingWithArgmax2D", 1, 2, ranks={"in0": (4, 4)})
_add("MaxUnpooling2D", 2, ranks={"in0": (4, 4)})
_add("Landmarks2TransformMatrix", 1, types={"in0": frozenset({"FLOAT32"}), "out0": frozenset({"FLOAT32"})},
     ranks={"in0": (3, 4)})
_add("TFLite_Detection_PostProcess", 3, 4, types={f"out{i}": frozenset({"FLOAT32"}) for i in range(4)},
     ranks={"in0": (3, 3), "in1": (3, 3), "in2": (2, 2)})
_add("ADD_N", (2, ANY), same_type=("in0", "out0"))
_add("FAKE_QUANT", 1, same_type=_UNARY_SAME, types={"in0": F32})
_add("BUCKETIZE", 1, types={"out0": frozenset({"INT32"})})
_add("BITWISE_XOR RIGHT_SHIFT", 2, same_type=("in0", "in1", "out0"))
_add("LOCAL_RESPONSE_NORMALIZATION", 1, same_type=_UNARY_SAME, types={"in0": F32}, ranks={"in0": (4, 4)})
_add("ONE_HOT", 4, types={"in0": INDEX, "in1": frozenset({"INT32"})}, same_type=("in2", "in3", "out0"))
_add("EMBEDDING_LOOKUP", 2, types={"in0": frozenset({"INT32"})}, ranks={"in0": (1, 1)})
_add("DYNAMIC_UPDATE_SLICE", 3, same_type=("in0", "in1", "out0"), types={"in2": INDEX}, ranks={"in2": (1, 1)})
_add("UNSORTED_SEGMENT_SUM UNSORTED_SEGMENT_PROD UNSORTED_SEGMENT_MAX UNSORTED_SEGMENT_MIN", 3,
     same_type=("in0", "out0"), types={"in1": frozenset({"INT32"}), "in2": frozenset({"INT32"})})
_add("REVERSE_SEQUENCE", 2, same_type=_UNARY_SAME, types={"in1": INDEX}, ranks={"in1": (1, 1)})
_add("MATRIX_DIAG", 1, same_type=_UNARY_SAME, ranks={"in0": (1, 16)})
_add("MATRIX_SET_DIAG", 2, same_type=("in0", "in1", "out0"), ranks={"in0": (2, 16)})
_add("BROADCAST_ARGS", 2, same_type=("in0", "in1", "out0"), types={"in0": INDEX},
     ranks={"in0": (1, 1), "in1": (1, 1)})
_add("BITCAST", 1)
_add("WHERE", 1, types={"out0": INDEX})
_add("UNIQUE", 1, 2, same_type=_UNARY_SAME, types={"out1": INDEX}, ranks={"in0": (1, 1)})
_add("SEGMENT_SUM", 2, same_type=_UNARY_SAME, types={"in1": frozenset({"INT32"})})
_add("CONV_3D", (2, 3), optional=[2], same_type=("in0", "in1", "out0"), types={"in0": F32},
     ranks={"in0": (5, 5), "in1": (5, 5)})
_add("CONV_3D_TRANSPOSE", (3, 4), optional=[3], same_type=("in1", "in2", "out0"),
     types={"in0": frozenset({"INT32"}), "in2": F32}, ranks={"in0": (1, 1), "in1": (5, 5), "in2": (5, 5)})
_add("RNN", 5, types={"in0": F32}, ranks={"in0": (2, 2), "in1": (2, 2), "in2": (2, 2), "in3": (1, 1)})
_add("UNIDIRECTIONAL_SEQUENCE_RNN", 5, types={"in0": F32},
     ranks={"in0": (3, 3), "in1": (2, 2), "in2": (2, 2), "in3": (1, 1)})
_add("BIDIRECTIONAL_SEQUENCE_RNN", 12, (1, 2), optional=[9, 10, 11], types={"in0": F32},
     ranks={"in0": (3, 3), "in1": (2, 2), "in2": (2, 2), "in3": (1, 1), "in5": (2, 2), "in6": (2, 2), "in7": (1, 1)})
_STRING = frozenset({"STRING"})
_add("SKIP_GRAM", 1, types={"in0": _STRING, "out0": _STRING})
_add("LSH_PROJECTION", (2, 3), types={"in0": F32, "in2": F32, "out0": frozenset({"INT32"})},
     ranks={"in0": (2, 2), "in1": (1, 16), "in2": (1, 1)})
_add("SVDF", 5, optional=[3], same_type=("in0", "out0"), types={"in0": frozenset({"FLOAT32", "INT8"})},
     ranks={"in0": (2, 2), "in1": (2, 2), "in2": (2, 2), "in3": (1, 1), "in4": (2, 2)})
_SCALAR = (0, 0)
_add("NON_MAX_SUPPRESSION_V4", 5, 2, types={"in0": F32, "in1": F32, "in2": frozenset({"INT32"}), "in3": F32, "in4": F32,
     "out0": frozenset({"INT32"}), "out1": frozenset({"INT32"})},
     ranks={"in0": (2, 2), "in1": (1, 1), "in2": _SCALAR, "in3": _SCALAR, "in4": _SCALAR})
_add("NON_MAX_SUPPRESSION_V5", 6, 3, types={"in0": F32, "in1": F32, "in2": frozenset({"INT32"}), "in3": F32, "in4": F32,
     "in5": F32, "out0": frozenset({"INT32"}), "out1": F32, "out2": frozenset({"INT32"})},
     ranks={"in0": (2, 2), "in1": (1, 1), "in2": _SCALAR, "in3": _SCALAR, "in4": _SCALAR, "in5": _SCALAR})
_add("TransformLandmarks", 2, same_type=("in0", "in1", "out0"), types={"in0": frozenset({"FLOAT32"})},
     ranks={"in0": (3, 4)})
_add("TransformTensorBilinear TransformTensor", 2, same_type=("in0", "in1", "out0"),
     types={"in0": frozenset({"FLOAT32"})}, ranks={"in0": (4, 4)})
_add("DEPTH_TO_SPACE SPACE_TO_DEPTH", 1, same_type=_UNARY_SAME, ranks={"in0": (4, 4)})
_add("SQUEEZE", 1, same_type=_UNARY_SAME)
_add("RESHAPE", (1, 2), same_type=_UNARY_SAME, optional=[1])
_add("ADD SUB MUL DIV POW MAXIMUM MINIMUM FLOOR_DIV FLOOR_MOD SQUARED_DIFFERENCE ATAN2", 2,
     same_type=("in0", "in1"))
_add("EQUAL NOT_EQUAL GREATER GREATER_EQUAL LESS LESS_EQUAL", 2, same_type=("in0", "in1"))  # (TFLite sets out0 BOOL)
_add("LOGICAL_AND LOGICAL_OR", 2, types={"in0": BOOL, "in1": BOOL})
_add("PRELU", 2, same_type=("in0", "in1", "out0"))  # (LiteRT reads an int8 alpha's bytes as floats)
_add("BATCH_MATMUL", 2, ranks={"in0": (2, 5), "in1": (2, 5)})
_add("ARG_MAX ARG_MIN", 2, types={"in1": INDEX, "out0": INDEX})
_add("EXPAND_DIMS", 2, same_type=_UNARY_SAME, types={"in1": INDEX})
_add("BROADCAST_TO TILE", 2, same_type=_UNARY_SAME, types={"in1": INDEX}, ranks={"in1": (1, 1)})
_add("FILL", 2, same_type=("in1", "out0"), types={"in0": INDEX}, ranks={"in0": (1, 1)})
_add("TRANSPOSE", 2, same_type=_UNARY_SAME, types={"in1": INDEX}, ranks={"in1": (1, 1)})
_add("GATHER", 2, same_type=_UNARY_SAME, types={"in1": INDEX | {"INT16"}})
_add("GATHER_ND", 2, same_type=_UNARY_SAME, types={"in1": INDEX}, ranks={"in1": (1, 16)})
_add("PAD MIRROR_PAD", 2, same_type=_UNARY_SAME, types={"in1": INDEX}, ranks={"in1": (2, 2)})
_add("PADV2", (2, 3), same_type=_UNARY_SAME, types={"in1": INDEX}, ranks={"in1": (2, 2)}, optional=[2])
_add("REVERSE_V2", 2, same_type=_UNARY_SAME, types={"in1": INDEX})
_add("MEAN SUM REDUCE_MAX REDUCE_MIN REDUCE_PROD", 2, types={"in1": INDEX})
_add("REDUCE_ALL REDUCE_ANY", 2, types={"in0": BOOL, "in1": INDEX})
_add("CUMSUM", 2, same_type=_UNARY_SAME, types={"in1": INDEX})
_add("RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR", 2, same_type=_UNARY_SAME, types={"in1": INDEX},
     ranks={"in0": (4, 4), "in1": (1, 1)})
_add("SELECT SELECT_V2", 3, same_type=("in1", "in2", "out0"), types={"in0": BOOL})
_add("SLICE", 3, same_type=_UNARY_SAME, types={"in1": INDEX, "in2": INDEX})
_add("STRIDED_SLICE", 4, same_type=_UNARY_SAME, types={"in1": INDEX, "in2": INDEX, "in3": INDEX})
_add("SPLIT", 2, (1, ANY), same_type=("in1", "out0"), types={"in0": INDEX})
_add("SPLIT_V", 3, (1, ANY), same_type=_UNARY_SAME, types={"in1": INDEX, "in2": INDEX})
_add("UNPACK", 1, (1, ANY), same_type=_UNARY_SAME)
_add("PACK CONCATENATION", (1, ANY), same_type=("in0", "out0"), inputs_alike=True)
_add("TOPK_V2", 2, 2, same_type=_UNARY_SAME)
_add("RANGE", 3, same_type=("in0", "in1", "in2", "out0"))
_add("SCATTER_ND", 3, same_type=("in1", "out0"), types={"in0": INDEX, "in2": INDEX})
_add("SPACE_TO_BATCH_ND BATCH_TO_SPACE_ND", 3, same_type=_UNARY_SAME, types={"in1": INDEX, "in2": INDEX})
_CONV_RANKS = {"in0": (4, 4), "in1": (4, 4), "in2": (1, 1)}
_add("CONV_2D DEPTHWISE_CONV_2D", (2, 3), optional=[2], ranks=_CONV_RANKS, nonempty=("in1",))
# (graph.conv_arg's internal op: a CONV_2D and the ARG_MAX / ARG_MIN over its channels; out0 omitted where unread)
_add("TFLGPU_CONV_ARG", (2, 3), 2, optional=[2], ranks=_CONV_RANKS, nonempty=("in1",), types={"out1": INDEX})
_add("FULLY_CONNECTED", (2, 3), (1, 2), optional=[2], ranks={"in0": (1, 16), "in1": (2, 2), "in2": (1, 1)},
     nonempty=("in1",))
_add("TRANSPOSE_CONV", (3, 4), optional=[3], types={"in0": INDEX},
     ranks={"in0": (1, 1), "in1": (4, 4), "in2": (4, 4), "in3": (1, 1)})
_add("Convolution2DTransposeBias", 3, ranks={"in0": (4, 4), "in1": (4, 4), "in2": (1, 1)})
_add("LSTM", (5, 24), (1, 4), any_optional=True)  # (5 inputs, 4 outputs: the basic kernel)
_add("UNIDIRECTIONAL_SEQUENCE_LSTM", (20, 24), (1, 4), any_optional=True, ranks={"in0": (3, 3)})
_add("BIDIRECTIONAL_SEQUENCE_LSTM", 48, (1, 2), any_optional=True, ranks={"in0": (3, 3)})
_add("SPARSE_TO_DENSE", 4, same_type=("in2", "in3", "out0"), types={"in0": INDEX, "in1": INDEX},
     ranks={"in0": (0, 2), "in1": (1, 1), "in2": (0, 1), "in3": (0, 1)})
_add("DILATE", 3, same_type=("in0", "in2", "out0"), types={"in1": frozenset({"INT32"})}, ranks={"in1": (1, 1)})
_add("REDUCE_WINDOW", 5, same_type=("in0", "in1", "out0"), types={f"in{i}": frozenset({"INT64"}) for i in (2, 3, 4)},
     ranks={"in2": (1, 1), "in3": (1, 1), "in4": (1, 1)})
_add("RANDOM_UNIFORM RANDOM_STANDARD_NORMAL", 1, types={"in0": frozenset({"INT32"}), "out0": F32},
     ranks={"in0": (1, 1)})
_add("MULTINOMIAL", 2, types={"in0": F32, "in1": frozenset({"INT32"}), "out0": INDEX},
     ranks={"in0": (2, 2), "in1": (0, 0)})
_add("HASHTABLE", 0, 1)
_add("HASHTABLE_IMPORT", 3, 0)
_add("HASHTABLE_FIND", 3, 1, same_type=("in2", "out0"))
_add("HASHTABLE_SIZE", 1, 1, types={"out0": frozenset({"INT64"})})
_add("HASHTABLE_LOOKUP", 3, 2, same_type=("in2", "out0"), types={"in0": frozenset({"INT32"}),
     "in1": frozenset({"INT32"}), "out1": frozenset({"UINT8"})})
_add("EMBEDDING_LOOKUP_SPARSE", 5, types={"in0": frozenset({"INT32"}), "in1": frozenset({"INT32"}),
     "in2": frozenset({"INT32"}), "in3": F32, "out0": F32}, ranks={"in0": (1, 1), "in1": (2, 2), "in2": (1, 1),
                                                                  "in3": (1, 1), "in4": (2, 8)})
_add("STABLEHLO_ADD STABLEHLO_MULTIPLY STABLEHLO_MAXIMUM STABLEHLO_MINIMUM STABLEHLO_AND STABLEHLO_SHIFT_LEFT "
     "STABLEHLO_PAD", 2, same_type=("in0", "in1", "out0"))
_add("STABLEHLO_GATHER", 2, same_type=_UNARY_SAME, types={"in1": INDEX})
_add("STABLEHLO_SCATTER", 3, same_type=("in0", "in2", "out0"), types={"in1": INDEX})
_add("STABLEHLO_REDUCE_WINDOW", 2, same_type=("in0", "in1", "out0"), ranks={"in1": (0, 0)})
_U64 = frozenset({"UINT64"})
_add("STABLEHLO_RNG_BIT_GENERATOR", 1, 2, types={"in0": _U64, "out0": _U64}, ranks={"in0": (1, 1)})
_add("STABLEHLO_CASE", (1, ANY), (0, ANY), types={"in0": frozenset({"INT32"})}, ranks={"in0": (0, 0)})
_add("STABLEHLO_COMPOSITE", (0, ANY), (0, ANY))  # (its decomposition's signature: checked by the call)
_add("WHILE IF CALL_ONCE", (0, ANY), (0, ANY), any_optional=True)
_add("VAR_HANDLE", 0, 1)
_add("ASSIGN_VARIABLE", 2, 0)
_add("READ_VARIABLE", 1, 1)


def signature(name: str) -> Signature | None:
    """The signature of the op called ``name`` (a builtin name or a custom code), None for an unknown op."""
    return _TABLE.get(name)


def _count(what: str, n: int, lo: int, hi: int) -> str | None:
    if lo == hi and n != lo:
        return f"Num{what}(node) != {lo} ({n} != {lo})"
    if not lo <= n <= hi:
        most = "any number" if hi >= ANY else str(hi)
        return f"Num{what}(node) = {n}, expected {lo} to {most}"
    return None


def problems(op: Operator, sg: Subgraph) -> list[str]:
    """What is wrong with this node by its op's signature (empty: nothing), in TFLite's words where it has them.
    Ops without a signature (custom ops, builtins no kernel runs) are left to the kernel lookup."""
    sig = _TABLE.get(op.name)
    if sig is None:
        return []
    found = [m for m in (_count("Inputs", len(op.inputs), *sig.inputs),
                         _count("Outputs", len(op.outputs), *sig.outputs)) if m]
    if found:
        return found
    if not sig.any_optional:
        found += [f"input {i} is required but omitted (-1)" for i, t in enumerate(op.inputs)
                  if t < 0 and i not in sig.optional]
    found += [f"output {i} is omitted (-1)" for i, t in enumerate(op.outputs) if t < 0]

    def tensor(ref: str):
        seq = op.inputs if ref.startswith("in") else op.outputs
        i = int(ref[2:] if ref.startswith("in") else ref[3:])
        return sg.tensors[seq[i]] if i < len(seq) and seq[i] >= 0 else None

    refs = sig.same_type + (tuple(f"in{i}" for i in range(len(op.inputs))) if sig.inputs_alike else ())
    group = [(ref, t) for ref in dict.fromkeys(refs) if (t := tensor(ref)) is not None]
    for ref, t in group[1:]:
        first_ref, first = group[0]
        if t.type_name != first.type_name:
            found.append(f"{first_ref}->type != {ref}->type ({first.type_name} != {t.type_name})")
    for ref, allowed in sig.types.items():
        t = tensor(ref)
        if t is not None and t.type_name not in allowed:
            found.append(f"{ref} has type {t.type_name}, expected {' or '.join(sorted(allowed))}")
    def given(t) -> bool:  # a shape the model fixes; an intermediate's may be stale (recomputed at run time)
        return t is not None and (t.is_constant or t.index in sg.inputs)

    for ref, (lo, hi) in sig.ranks.items():
        t = tensor(ref)
        if given(t) and not lo <= len(t.shape) <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            found.append(f"NumDimensions({ref}) = {len(t.shape)}, expected {want}")
    for ref in sig.nonempty:
        t = tensor(ref)
        if given(t) and 0 in t.shape:
            found.append(f"{ref} has a zero dimension: shape {list(t.shape)}")
    return found
