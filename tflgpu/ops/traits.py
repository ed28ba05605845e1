"""One table of what the graph stages need to know about an op, keyed by op name.

The constant folder, the dead-op pass, the loop unroller, the fusion pass, the float view of quantized
models and both backends read these facts here, so each is written once. An op not in the table has
every trait at its default (no side effects, not transparent to quantization, not fusable, ...).
Adding an op: give it an entry only where one of these facts is true of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class OpTraits:
    # Has side effects or must see run-time state: never folded to a constant, never culled as dead,
    # and a loop containing it is not unrolled.
    side_effects: bool = False
    # Only selects or moves values: on equal input/output quantization the raw integers are exact, so a
    # quantized model runs it on the stored integers and needs no quantization simulator after it.
    quant_transparent: bool = False
    # Defined on the stored integers whatever the quantization (CAST converts the raw values, as TFLite),
    # so it has no float view.
    raw_integers: bool = False
    # Its output values lie on its input's quantization grid, so the float view needs no simulator after it.
    keeps_quant_grid: bool = False
    # "unary" or "binary": may join its producer's kernel as an epilogue step (an elementwise op).
    fusable: str | None = None
    # A producer whose kernel accepts an epilogue of fused elementwise ops.
    takes_epilogue: bool = False
    # The input index of its bias (a float view dequantizes an int32 bias with the input x weight scale).
    bias_input: int | None = None
    # Its output is decided by how its float inputs compare (an index, an order, a selection; a float view's
    # quantization simulator, rounding to its grid): a rounding that swaps two near-equal values, or moves one
    # across a grid point's edge, changes the answer whole, so an FP16 plan keeps what it reads exact.
    ranks: bool = False
    # Its integer kernel rounds a mean of the stored integers (zero point included) half away from zero
    # (TFLite's int8 / uint8 AVERAGE_POOL_2D), not the rescaled value half to even: its float view's
    # quantization simulator rounds the same way.
    rounds_raw_mean: bool = False
    # Its kernel computes from exact (FP32) inputs and can store its float output in half (the storage cast its
    # FP16 readers would read, merged into it): an FP32 instance in an FP16 plan stores that output in half where
    # only FP16 ops read it (graph.precision). Its own comparison (a fused ARG_MAX) reads the float sum.
    casts_own_output: bool = False
    # Its integer outputs are positions along an axis of one of its float inputs (an ARG_MAX's, a TOPK_V2's
    # indices): bounded by that axis' length (graph.indices).
    makes_index: bool = False
    # Its output's values are some of its first input's values, moved or selected (the other inputs are shapes,
    # positions or axes): an integer output is bounded as that input is (graph.indices).
    picks_first: bool = False
    # Its output is its input under another shape, every value in its place (RESHAPE, SQUEEZE, EXPAND_DIMS): where
    # the slice layout orders both alike the plan links it (runtime.selection.link_reshapes).
    reshapes: bool = False
    # Its ``fused_activation_function`` clamps its output (TFLite's CalculateActivationRange: the RELU family),
    # so a float view may move that clamp into the quantization simulator after it (graph.float_view).
    clamps_output: bool = False
    # Each output value is one input value at coordinates its own coordinates give (kernels.reindex.IndexMap: a
    # reshape, a transpose, a slice, a gather by constant indices), so such moves in a row compose into one kernel
    # (graph.passes.fold_moves).
    maps_indices: bool = False
    # Its float output lies within [-1, 1] whatever its input (a probability, a squashed value): a graph output
    # it makes is judged on that scale by the FP16 calibration (runtime.precision), so a probability of 3e-9
    # that half storage makes 0 is an error of 3e-9, not the whole of the output.
    unit_bounded: bool = False
    # The inputs whose values decide its output shapes, with its inputs' shapes and its options (a RESHAPE's new
    # shape, a MEAN's axes, a WHERE's condition; () where only shapes do). None (the default): not known here (control
    # flow, variables): a shape propagation that stands zeros in for the kernels it skips (SubgraphRunner.shapes,
    # ops.shapes) runs the whole graph instead where such an op, or such an input, reads them. graph.sizes reads it too:
    # a size from values not known when a plan is built is a size the data sets.
    shape_inputs: tuple[int, ...] | None = None
    # Its output's values are its input's shape (SHAPE, RANK): known whatever stands in for that input's values.
    values_from_shape: bool = False


_DEFAULT = OpTraits()
_TABLE: dict[str, OpTraits] = {}


def _add(names: str, **facts) -> None:
    for name in names.split():
        _TABLE[name] = replace(_TABLE.get(name, _DEFAULT), **facts)


_add("WHILE IF STABLEHLO_CASE CALL_ONCE VAR_HANDLE ASSIGN_VARIABLE READ_VARIABLE RANDOM_UNIFORM RANDOM_STANDARD_NORMAL "
     "MULTINOMIAL LSTM UNIDIRECTIONAL_SEQUENCE_LSTM BIDIRECTIONAL_SEQUENCE_LSTM RNN UNIDIRECTIONAL_SEQUENCE_RNN "
     "BIDIRECTIONAL_SEQUENCE_RNN SVDF STABLEHLO_COMPOSITE HASHTABLE HASHTABLE_IMPORT HASHTABLE_FIND HASHTABLE_SIZE",
     side_effects=True)
_add("RESHAPE SQUEEZE EXPAND_DIMS TRANSPOSE GATHER GATHER_ND SLICE STRIDED_SLICE SPLIT SPLIT_V UNPACK PACK "
     "SPACE_TO_DEPTH DEPTH_TO_SPACE BATCH_TO_SPACE_ND SPACE_TO_BATCH_ND TILE BROADCAST_TO REVERSE_V2 PAD PADV2 "
     "MIRROR_PAD RESIZE_NEAREST_NEIGHBOR MAXIMUM MINIMUM REDUCE_MAX REDUCE_MIN ARG_MAX ARG_MIN SHAPE IDENTITY "
     "ZEROS_LIKE SELECT SELECT_V2 CONCATENATION", quant_transparent=True, keeps_quant_grid=True)
_add("MAX_POOL_2D", keeps_quant_grid=True)
_add("AVERAGE_POOL_2D", rounds_raw_mean=True)
_add("ARG_MAX ARG_MIN TOPK_V2 NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5 TFLite_Detection_PostProcess QUANT_SIM "
     "TFLGPU_CONV_ARG", ranks=True)
# (a step function of its inputs: a rounding across an edge moves the answer whole, as a ranking's; the FP16
# calibration keeps what it reads exact where its answer moved)
_add("FLOOR CEIL ROUND SIGN FLOOR_DIV FLOOR_MOD LESS LESS_EQUAL GREATER GREATER_EQUAL EQUAL NOT_EQUAL FAKE_QUANT "
     "BUCKETIZE", ranks=True)
_add("TFLGPU_CONV_ARG CAST", casts_own_output=True)
_add("ARG_MAX ARG_MIN TOPK_V2 TFLGPU_CONV_ARG", makes_index=True)
_add("RESHAPE SQUEEZE EXPAND_DIMS SLICE STRIDED_SLICE GATHER TRANSPOSE", picks_first=True)
_add("RESHAPE SQUEEZE EXPAND_DIMS", reshapes=True)
_add("RESHAPE SQUEEZE EXPAND_DIMS TRANSPOSE GATHER STRIDED_SLICE SLICE", maps_indices=True)
_add("CAST BITCAST", raw_integers=True)
_add("RELU RELU6 RELU_N1_TO_1 LOGISTIC TANH EXP LOG HARD_SWISH ABS RSQRT SQRT NEG SQUARE SIN COS ELU "
     "LEAKY_RELU QUANT_SIM GELU FLOOR CEIL ROUND SIGN RELU_0_TO_1 TFLGPU_SWISH", fusable="unary")
_add("ADD SUB MUL MAXIMUM MINIMUM PRELU", fusable="binary")
_add("CONV_2D DEPTHWISE_CONV_2D FULLY_CONNECTED TRANSPOSE_CONV Convolution2DTransposeBias TFLGPU_SEPARABLE_CONV "
     "TFLGPU_EXPAND_DEPTHWISE SOFTMAX LOG_SOFTMAX L2_NORMALIZATION TFLGPU_LAYER_NORM TFLGPU_CONCAT_VIEWS",
     takes_epilogue=True)
_add("CONV_2D DEPTHWISE_CONV_2D FULLY_CONNECTED", bias_input=2)
_add("CONV_2D DEPTHWISE_CONV_2D FULLY_CONNECTED TRANSPOSE_CONV ADD SUB MUL DIV", clamps_output=True)
_add("TRANSPOSE_CONV", bias_input=3)
_add("LOGISTIC SOFTMAX TANH RELU_0_TO_1 RELU_N1_TO_1", unit_bounded=True)
# a move of one output made by kernels.reindex's lane kernel (a reshape's copy too) stores through the same
# epilogue: a PAD -> RELU, a RESHAPE -> MUL is one launch (not a concatenation: linked, it launches nothing)
_add("RESHAPE SQUEEZE EXPAND_DIMS TRANSPOSE PAD PADV2 STRIDED_SLICE SLICE DEPTH_TO_SPACE "
     "SPACE_TO_DEPTH RESIZE_NEAREST_NEIGHBOR BATCH_MATMUL GATHER MIRROR_PAD TILE BROADCAST_TO REVERSE_V2 PACK TFLGPU_MOVES",
     takes_epilogue=True)
# an elementwise op's own kernel (kernels.elementwise) takes the elementwise ops after it too: a chain is one launch
_add(" ".join(name for name, facts in _TABLE.items() if facts.fusable), takes_epilogue=True)

# (what decides output shapes: ops.shapes' rules read these inputs' values; another op reading a skipped kernel's
# zeros runs on them, which gives its shapes only where they come from its inputs' shapes)
_add("ABS CEIL COS ELU EXP FLOOR GELU HARD_SWISH LEAKY_RELU LOG LOGISTIC NEG RELU RELU6 RELU_0_TO_1 RELU_N1_TO_1 "
     "ROUND RSQRT SIGN SIN SQRT SQUARE TANH ZEROS_LIKE ONES_LIKE L2_NORMALIZATION SOFTMAX LOG_SOFTMAX QUANT_SIM "
     "QUANTIZE DEQUANTIZE CAST LOGICAL_NOT ADD SUB MUL DIV POW MAXIMUM MINIMUM FLOOR_DIV FLOOR_MOD SQUARED_DIFFERENCE "
     "ATAN2 EQUAL NOT_EQUAL GREATER GREATER_EQUAL LESS LESS_EQUAL LOGICAL_AND LOGICAL_OR PRELU SELECT SELECT_V2 "
     "AVERAGE_POOL_2D MAX_POOL_2D L2_POOL_2D CONV_2D DEPTHWISE_CONV_2D FULLY_CONNECTED BATCH_MATMUL CONCATENATION "
     "PACK UNPACK SQUEEZE DEPTH_TO_SPACE SPACE_TO_DEPTH GATHER GATHER_ND REVERSE_V2 CUMSUM SHAPE RANK IDENTITY "
     "Convolution2DTransposeBias TFLGPU_CONV_ARG UNIDIRECTIONAL_SEQUENCE_LSTM RNN UNIDIRECTIONAL_SEQUENCE_RNN "
     "REAL IMAG COMPLEX_ABS "
     "Landmarks2TransformMatrix TransformLandmarks TransformTensorBilinear TransformTensor "  # (MediaPipe's: options)
     "TFLite_Detection_PostProcess ADD_N FAKE_QUANT BUCKETIZE BITWISE_XOR RIGHT_SHIFT LOCAL_RESPONSE_NORMALIZATION "
     "DYNAMIC_UPDATE_SLICE REVERSE_SEQUENCE MATRIX_DIAG MATRIX_SET_DIAG BROADCAST_ARGS BITCAST EMBEDDING_LOOKUP "
     "CONV_3D SVDF BIDIRECTIONAL_SEQUENCE_RNN BIDIRECTIONAL_SEQUENCE_LSTM",
     shape_inputs=())
_add("RESHAPE EXPAND_DIMS TRANSPOSE PAD PADV2 MIRROR_PAD MEAN SUM REDUCE_MAX REDUCE_MIN REDUCE_PROD REDUCE_ALL "
     "REDUCE_ANY RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR TILE BROADCAST_TO ARG_MAX ARG_MIN TOPK_V2 ONE_HOT",
     shape_inputs=(1,))
_add("UNSORTED_SEGMENT_SUM UNSORTED_SEGMENT_PROD UNSORTED_SEGMENT_MAX UNSORTED_SEGMENT_MIN", shape_inputs=(2,))
# (WHERE: a row per true value; SKIP_GRAM: an n-gram per choice of words)
_add("SPLIT FILL TRANSPOSE_CONV CONV_3D_TRANSPOSE WHERE UNIQUE SKIP_GRAM", shape_inputs=(0,))
_add("SEGMENT_SUM SPARSE_TO_DENSE DILATE", shape_inputs=(1,))
_add("REDUCE_WINDOW", shape_inputs=(2, 3, 4))
_add("EMBEDDING_LOOKUP_SPARSE", shape_inputs=(2,))
_add("RANDOM_UNIFORM RANDOM_STANDARD_NORMAL", shape_inputs=(0,))
_add("MULTINOMIAL", shape_inputs=(1,))
_add("HASHTABLE HASHTABLE_SIZE HASHTABLE_FIND HASHTABLE_LOOKUP", shape_inputs=())
_add("RANGE", shape_inputs=(0, 1, 2))
_add("SCATTER_ND", shape_inputs=(2,))
_add("MaxPoolingWithArgmax2D MaxUnpooling2D", shape_inputs=())
_add("NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5", shape_inputs=(2,))  # (max_output_size rows, zeros past the count)
_add("RFFT2D", shape_inputs=(1,))
_add("SLICE SPACE_TO_BATCH_ND BATCH_TO_SPACE_ND", shape_inputs=(1, 2))
_add("STRIDED_SLICE", shape_inputs=(1, 2, 3))
_add("SPLIT_V", shape_inputs=(1, 2))
_add("SHAPE RANK", values_from_shape=True)


def traits(name: str) -> OpTraits:
    """The traits of the op called ``name`` (a builtin name or a custom code)."""
    return _TABLE.get(name, _DEFAULT)


def ops_with(**facts) -> frozenset[str]:
    """The names of every op whose traits have these values, e.g. ``ops_with(side_effects=True)``."""
    return frozenset(n for n, t in _TABLE.items() if all(getattr(t, k) == v for k, v in facts.items()))
