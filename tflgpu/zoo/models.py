"""The architectures of the test corpus (``../shared/models``, written by TensorFlow's converter from Keras
models), rebuilt layer by layer with our own builder: the same ops with the same options, shapes, data types,
inputs, outputs and signature, and random weights.

Each function adds one model to a Net; ``tflgpu.zoo.STANDINS`` lists which corpus file each one stands in for.
"""

from __future__ import annotations

import numpy as np

from .net import Act, Net, Precision

_MNV2_STAGES = [  # expansion t, channels c, repeats n, first stride s (MobileNetV2, table 2)
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
]
_MNV1_BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *[(512, 1)] * 5, (1024, 2), (1024, 1)]
INPUT = "serving_default_input:0"
# the converter writes these ops' option tables even when every value is the default
_WRITTEN_DEFAULTS = {
    "ADD": {"fused_activation_function": "NONE", "pot_scale_int16": True},
    "SUB": {"fused_activation_function": "NONE", "pot_scale_int16": True},
    "MUL": {"fused_activation_function": "NONE"},
    "FULLY_CONNECTED": {"fused_activation_function": "NONE"},
}


def _options(op: str, options: dict) -> dict:
    return {**_WRITTEN_DEFAULTS.get(op, {}), **options}


def _output_name(i: int = 0) -> str:
    return f"StatefulPartitionedCall_1:{i}"


# -- backbones ------------------------------------------------------------------------------------------------

def mobilenet_v2_features(net: Net, x: Act, prefix: str, *, output_stride: int = 32,
                          tap: str | None = None, on_tap=None) -> Act:
    """MobileNetV2 (alpha 1.0) from Conv1 to the 320-channel block 16, as keras.applications names it.

    With ``output_stride`` 16 the stage that would reach stride 32 keeps stride 16 and the blocks after its
    first one dilate their depthwise convs by 2 (DeepLab's atrous MobileNetV2). ``on_tap(net, act)`` is called
    with the tensor named ``tap`` when it is made (SSD's first box predictor hangs off ``block_13_expand``)."""
    y = net.conv(x, 32, k=3, stride=2, name=f"{prefix}/Conv1")
    block, stride_so_far, dilation = 0, 2, 1
    for t, c, n, s in _MNV2_STAGES:
        for i in range(n):
            stride = s if i == 0 else 1
            next_dilation = dilation
            if stride > 1 and stride_so_far * stride > output_stride:
                stride, next_dilation = 1, dilation * 2
            stride_so_far *= stride
            name = f"{prefix}/block_{block}" if block else f"{prefix}/expanded_conv"
            inp = y
            if t != 1:
                y = net.conv(y, inp.shape[3] * t, name=f"{name}_expand")
                if on_tap is not None and f"block_{block}_expand" == tap:
                    on_tap(net, y)
            y = net.depthwise(y, stride=stride, dilation=dilation, name=f"{name}_depthwise")
            y = net.conv(y, c, act="NONE", name=f"{name}_project")
            if stride == 1 and c == inp.shape[3]:
                y = net.add(inp, y, name=f"{name}_add")
            dilation = next_dilation if i == 0 else dilation
            block += 1
    return y


def mobilenet_v1_features(net: Net, x: Act, prefix: str, *, output_stride: int = 32) -> Act:
    """MobileNet v1 (alpha 1.0): conv1 and the 13 depthwise-separable blocks; atrous past ``output_stride``."""
    y = net.conv(x, 32, k=3, stride=2, name=f"{prefix}/conv1")
    stride_so_far, dilation = 2, 1
    for i, (filters, stride) in enumerate(_MNV1_BLOCKS, start=1):
        block_dilation = dilation
        if stride > 1 and stride_so_far * stride > output_stride:
            stride, dilation = 1, dilation * 2
        stride_so_far *= stride
        y = net.depthwise(y, stride=stride, dilation=block_dilation, name=f"{prefix}/conv_dw_{i}")
        y = net.conv(y, filters, name=f"{prefix}/conv_pw_{i}")
    return y


# -- the corpus's models --------------------------------------------------------------------------------------

def mobilenet_v1(net: Net) -> None:
    p = "mobilenet_1.00_224"
    y = mobilenet_v1_features(net, net.input(INPUT, (1, 224, 224, 3)), p)
    y = net.mean(y, keep_dims=True, name=f"{p}/global_average_pooling2d/Mean")
    net.logits_name = f"{p}/conv_preds"
    y = net.conv(y, 1001, act="NONE", name=net.logits_name, scale=net.logit_scale)
    y = net.reshape(y, (1, 1001), name=f"{p}/reshape_2/Reshape")
    net.output(net.softmax(y, name=net.out_name(_output_name())), "output_0", _output_name())


def mobilenet_v2(net: Net) -> None:
    p = "mobilenetv2_1.00_224"
    y = mobilenet_v2_features(net, net.input(INPUT, (1, 224, 224, 3)), p)
    y = net.conv(y, 1280, padding="VALID", name=f"{p}/Conv_1")
    y = net.mean(y, keep_dims=False, name=f"{p}/global_average_pooling2d/Mean")
    net.logits_name = f"{p}/predictions/MatMul"
    y = net.fully_connected(y, 1001, name=net.logits_name, bias=False, scale=net.logit_scale)
    net.output(net.softmax(y, name=net.out_name(_output_name())), "output_0", _output_name())


def deeplab_mnv2(net: Net) -> None:
    p = "deeplab_mnv2_257"
    y = mobilenet_v2_features(net, net.input(INPUT, (1, 257, 257, 3)), p, output_stride=16)
    aspp0 = net.conv(y, 256, act="RELU", name=f"{p}/aspp0")
    pooled = net.mean(y, keep_dims=True, name=f"{p}/image_pooling/Mean")
    pooled = net.conv(pooled, 256, act="RELU", name=f"{p}/image_pooling_conv")
    pooled = net.resize_bilinear(pooled, aspp0.shape[1:3], name=f"{p}/image_pooling_resize")
    y = net.concat([pooled, aspp0], axis=3, name=f"{p}/aspp_concat")
    y = net.conv(y, 256, act="RELU", name=f"{p}/concat_projection")
    y = net.conv(y, 21, act="NONE", padding="VALID", name=f"{p}/logits")
    net.output(net.resize_bilinear(y, (257, 257), name=_output_name()), "segmentation_logits")


def posenet_mnv1(net: Net) -> None:
    p = "posenet_mnv1_257"
    y = mobilenet_v1_features(net, net.input(INPUT, (1, 257, 257, 3)), p, output_stride=16)
    heads = [("displacement_bwd", 32), ("displacement_fwd", 32), ("heatmaps", 17), ("offsets", 34)]
    outs = {sig: net.conv(y, ch, act="NONE", padding="VALID", name=_output_name(i))
            for i, (sig, ch) in enumerate(heads)}
    for sig in ("displacement_fwd", "offsets", "displacement_bwd", "heatmaps"):  # the converter's output order
        net.output(outs[sig], sig)


def ssd_mnv2(net: Net) -> None:
    """SSD-style detector: MobileNetV2 on 300x300, box and class predictors on the 19x19 block_13_expand map
    (3 anchors) and the 10x10 Conv_1 map (6 anchors), 91 classes with sigmoid scores."""
    p, classes = "ssd_mnv2_300", 91
    boxes, scores = [], []

    def predictor(net: Net, feature: Act, i: int, anchors: int) -> None:
        cells = feature.shape[1] * feature.shape[2] * anchors
        b = net.conv(feature, anchors * 4, act="NONE", padding="VALID", name=f"{p}/BoxPredictor_{i}_box")
        boxes.append(net.reshape(b, (1, cells, 4), name=f"{p}/BoxPredictor_{i}_box_reshape"))
        c = net.conv(feature, anchors * classes, act="NONE", padding="VALID", name=f"{p}/BoxPredictor_{i}_class")
        scores.append(net.reshape(c, (1, cells, classes), name=f"{p}/BoxPredictor_{i}_cls_reshape"))

    y = mobilenet_v2_features(net, net.input(INPUT, (1, 300, 300, 3)), p, tap="block_13_expand",
                              on_tap=lambda net, act: predictor(net, act, 0, 3))
    y = net.conv(y, 1280, padding="VALID", name=f"{p}/Conv_1")
    predictor(net, y, 1, 6)
    box = net.concat(boxes, axis=1, name=_output_name(0))
    cls = net.logistic(net.concat(scores, axis=1, name=f"{p}/class_logits"), name=_output_name(1))
    net.output(cls, "class_scores")
    net.output(box, "box_encodings")


def unet_small(net: Net) -> None:
    """A small U-Net: conv+PReLU pairs, max and (padded) average pooling down, transposed convs up with skip
    concatenations, a 1x1 classifier to 4 classes and a softmax."""
    p = "unet_small_256"

    def pair(y: Act, ch: int, name: str) -> Act:
        for half in ("a", "b"):
            y = net.conv(y, ch, k=3, act="NONE", name=f"{p}/{name}{half}_conv")
            y = net.prelu(y, name=f"{p}/{name}{half}_prelu")
        return y

    e1 = pair(net.input(INPUT, (1, 256, 256, 3)), 16, "enc1")
    e2 = pair(net.pool("MAX_POOL_2D", e1, k=2, stride=2, name=f"{p}/pool1_max"), 32, "enc2")
    padded = net.pad(e2, [[0, 0], [1, 1], [1, 1], [0, 0]], name=f"{p}/pool2_pad")
    e3 = pair(net.pool("AVERAGE_POOL_2D", padded, k=3, stride=2, name=f"{p}/pool2_avg"), 64, "enc3")
    y = pair(net.pool("MAX_POOL_2D", e3, k=2, stride=2, name=f"{p}/pool3_max"), 128, "bott_")
    for level, skip in ((3, e3), (2, e2), (1, e1)):
        up = net.transpose_conv(y, skip.shape[3], name=f"{p}/up{level}")
        y = pair(net.concat([up, skip], axis=3, name=f"{p}/skip{level}"), skip.shape[3], f"dec{level}")
    y = net.conv(y, 4, act="NONE", padding="VALID", name=f"{p}/classifier")
    net.output(net.softmax(y, name=_output_name()), "probs")


def opzoo_small(net: Net) -> None:
    """Two convolutions (one dilated, one depthwise with multiplier 2) feeding twenty elementwise, padding,
    slicing, resizing (all three coordinate modes) and reduction ops, two outputs."""
    b = net.b
    x = net.input(INPUT, (1, 32, 32, 8))
    c = b.tensor("add;Conv2D;Const_41", (1, 32, 32, 16))
    b.op("CONV_2D", [x.index, b.const("Conv2D", net.glorot((16, 3, 3, 8), 72, 144)),
                     b.const("add;Conv2D;Const_4", net.small(16))], [c],
         padding="SAME", stride_w=1, stride_h=1, dilation_w_factor=2, dilation_h_factor=2)
    d = b.tensor("add_1;depthwise;Const_21", (1, 32, 32, 16))
    b.op("DEPTHWISE_CONV_2D", [x.index, b.const("depthwise", net.glorot((1, 3, 3, 16), 72, 18)),
                               b.const("add_1;depthwise;Const_2", net.small(16))], [d],
         padding="SAME", stride_w=1, stride_h=1, depth_multiplier=2)

    def op(name: str, inputs, out: str, shape=(1, 32, 32, 16), **options) -> int:
        y = b.tensor(out, shape)
        b.op(name, inputs, [y], version=3 if name == "RESIZE_BILINEAR" else 1, **_options(name, options))
        return y

    add = op("ADD", [c, d], "add_2")
    tanh = op("TANH", [add], "Tanh")
    sub = op("SUB", [c, d], "sub")
    pad = op("PAD", [op("MAXIMUM", [add, sub], "Maximum"), net.int_const("Pad/paddings", [[0, 0], [2, 2], [2, 2],
                                                                                           [0, 0]])],
             "Pad", (1, 36, 36, 16))
    relu = op("RELU", [pad], "Relu", (1, 36, 36, 16))
    tanh1 = op("TANH", [op("MINIMUM", [add, sub], "Minimum")], "Tanh_1")
    mul = op("MUL", [tanh, op("LOGISTIC", [sub], "Sigmoid")], "mul")
    mul1 = op("MUL", [tanh1, b.const("arith.constant2", np.float32(3.0))], "mul_1")
    relu6 = op("RELU6", [op("EXP", [mul1], "Exp")], "Relu6")
    hswish = op("HARD_SWISH", [mul], "mul_3;;Relu6_1;add_3;mul_2;mul_3/y")
    sliced = op("STRIDED_SLICE", [relu, net.int_const("strided_slice/stack", [0, 2, 2, 0]),
                                  net.int_const("strided_slice/stack_1", [0, 34, 34, 0]),
                                  net.int_const("strided_slice/stack_2", [1, 2, 2, 1])],
                "strided_slice", (1, 16, 16, 16), begin_mask=9, end_mask=9)
    size = net.int_const("arith.constant1", [32, 32])
    resized = [op("RESIZE_BILINEAR", [sliced, size], name, align_corners=ac, half_pixel_centers=hp)
               for name, ac, hp in (("ResizeBilinear", False, False), ("ResizeBilinear_1", False, True),
                                    ("ResizeBilinear_2", True, False))]
    concat = op("CONCATENATION", [hswish, relu6, *resized], "concat", (1, 32, 32, 80), axis=-1)
    mean = op("MEAN", [concat, net.int_const("Mean/reduction_indices", [1, 2])], "Mean", (1, 80), keep_dims=False)
    fc = op("FULLY_CONNECTED", [mean, b.const("MatMul", net.glorot((10, 80), 80, 10)), b.const("add_4", net.small(10))],
            "MatMul;add_4", (1, 10))
    probs = Act(op("SOFTMAX", [fc], "PartitionedCall:1", (1, 10), beta=1.0), (1, 10), "PartitionedCall:1")
    features = Act(op("RESHAPE", [concat, net.int_const("arith.constant", [1, 1024, 80])], "PartitionedCall:0",
                      (1, 1024, 80)), (1, 1024, 80), "PartitionedCall:0")
    net.output(probs, "probs")
    net.output(features, "features")


def fallback_ops(net: Net) -> None:
    """Ops without OpenCL kernels (ARG_MAX, CAST, TOPK_V2, GATHER with runtime indices, CUMSUM) between
    convolutions, so a delegated plan has several partitions; three outputs of three dtypes' making."""
    b = net.b
    x = net.input(INPUT, (1, 32, 32, 8))

    def op(name: str, inputs, out: str, shape, dtype=np.float32, **options) -> int:
        y = b.tensor(out, shape, dtype)
        b.op(name, inputs, [y], **_options(name, options))
        return y

    conv = op("CONV_2D", [x.index, b.const("Conv2D", net.glorot((16, 3, 3, 8), 72, 144)),
                          b.const("Relu;add;Conv2D;Const_4", net.small(16))],
              "Relu;add;Conv2D;Const_41", (1, 32, 32, 16), padding="SAME", stride_w=1, stride_h=1,
              fused_activation_function="RELU")
    argmax = op("ARG_MAX", [conv, b.const("arith.constant", np.int32(-1))], "PartitionedCall:0", (1, 32, 32),
                np.int32, output_type=2)
    scaled = op("MUL", [op("CAST", [argmax], "Cast", (1, 32, 32)), b.const("mul/y", np.float32(0.0625))],
                "mul;ExpandDims;mul/y", (1, 32, 32), fused_activation_function="NONE")
    expanded = op("RESHAPE", [scaled, net.int_const("ExpandDims", [1, 32, 32, 1])], "mul;ExpandDims;mul/y1",
                  (1, 32, 32, 1))
    concat = op("CONCATENATION", [conv, expanded], "concat", (1, 32, 32, 17), axis=-1)
    conv1 = op("CONV_2D", [concat, b.const("Conv2D_1", net.glorot((32, 3, 3, 17), 153, 288)),
                           b.const("Relu_1;add_1;Conv2D_1;Const_2", net.small(32))],
               "Relu_1;add_1;Conv2D_1;Const_21", (1, 32, 32, 32), padding="SAME", stride_w=1, stride_h=1,
               fused_activation_function="RELU")
    mean = op("MEAN", [conv1, net.int_const("Mean/reduction_indices", [1, 2])], "Mean", (1, 32), keep_dims=False)
    values, indices = b.tensor("PartitionedCall:2", (1, 8)), b.tensor("TopKV2", (1, 8), np.int32)
    b.op("TOPK_V2", [mean, b.const("TopKV2/k", np.int32(8))], [values, indices])
    picked = op("STRIDED_SLICE", [indices, net.int_const("strided_slice2", [0, 0]),
                                  net.int_const("strided_slice1", [1, 8]), net.int_const("strided_slice", [1, 1])],
                "strided_slice3", (8,), np.int32, begin_mask=2, end_mask=2, shrink_axis_mask=1)
    gathered = op("GATHER", [conv1, picked], "GatherV2;GatherV2/axis", (1, 32, 32, 8), axis=3)
    cumsum = op("CUMSUM", [gathered, b.const("Cumsum/axis", np.int32(2))], "Cumsum", (1, 32, 32, 8), exclusive=False,
                reverse=False)
    # the last conv's weights are small: CUMSUM over 32 columns makes its input large
    features = op("CONV_2D", [cumsum, b.const("add_2;Conv2D_2;Const", net.glorot((16, 3, 3, 8), 72, 144) / 32),
                              b.const("add_2;Conv2D_2;Const1", net.small(16))],
                  "PartitionedCall:1", (1, 32, 32, 16), padding="SAME", stride_w=1, stride_h=1)
    net.output(Act(values, (1, 8), "PartitionedCall:2"), "topk_values")
    net.output(Act(argmax, (1, 32, 32), "PartitionedCall:0"), "argmax")
    net.output(Act(features, (1, 32, 32, 16), "PartitionedCall:1"), "features")


def lstm_small(net: Net) -> None:
    """Keras 2's LSTM(64) on 16 steps of 32 features as one UNIDIRECTIONAL_SEQUENCE_LSTM (state in variable
    tensors, cell clip 10), the last step sliced off and a 10-way dense layer."""
    b, units, features = net.b, 64, 32
    x = net.input(INPUT, (1, 16, features))
    gates_x = [b.const(f"arith.constant{4 + g}", net.glorot((units, features), features, 4 * units))
               for g in range(4)]
    gates_h = [b.const(f"arith.constant{8 + g}", net.glorot((units, units), units, 4 * units)) for g in range(4)]
    zeros = b.const("arith.constant12", np.zeros(units, np.float32))
    forget = b.const("arith.constant13", np.ones(units, np.float32))  # Keras' unit_forget_bias
    h_state = b.tensor("arith.constant3", (1, units), is_variable=True)
    c_state = b.tensor("arith.constant14", (1, units), is_variable=True)
    seq = b.tensor("tfl.unidirectional_sequence_lstm", (1, 16, units))
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM",
         [x.index, *gates_x, *gates_h, -1, -1, -1, zeros, forget, zeros, zeros, -1, -1, h_state, c_state,
          -1, -1, -1, -1], [seq], fused_activation_function="TANH", cell_clip=10.0, time_major=False)
    last = b.tensor("tfl.strided_slice", (1, units))
    b.op("STRIDED_SLICE", [seq, net.int_const("arith.constant", [0, -1, 0]),
                           net.int_const("arith.constant1", [0, 0, 0]), net.int_const("arith.constant2", [1, 1, 1])],
         [last], begin_mask=5, end_mask=5, shrink_axis_mask=2)
    logits = b.tensor("StatefulPartitionedCall:0", (1, 10))
    b.op("FULLY_CONNECTED", [last, b.const("lstm_small/logits/MatMul", net.glorot((10, units), units, 10)), -1],
         [logits], **_options("FULLY_CONNECTED", {}))
    net.output(Act(logits, (1, 10), "StatefulPartitionedCall:0"), "logits")


def lstm_small_keras3_while(net: Net) -> None:
    """The same LSTM as Keras 3 converts it: a WHILE loop over the time steps whose body holds the cell as
    FULLY_CONNECTED, SPLIT, LOGISTIC, TANH, MUL and ADD ops, and a condition subgraph."""
    b, units, features, steps = net.b, 64, 32, 16
    p = "lstm_small_keras3_1/lstm_1"
    x = net.input(INPUT, (1, steps, features))
    cond_index, cond = b.subgraph(f"{p}/while_cond")
    body_index, body = b.subgraph(f"{p}/while_body")
    state_shapes = [((), np.int32), ((), np.int32), ((1, 1, units), np.float32), ((1, units), np.float32),
                    ((1, units), np.float32), ((steps, 1, features), np.float32)]

    # main: time-major input, the loop, the last output, the dense layer
    time_major = b.tensor(f"{p}/transpose;{p}/transpose/perm1", (steps, 1, features))
    b.op("RESHAPE", [x.index, net.int_const(f"{p}/transpose;{p}/transpose/perm", [steps, 1, features])],
         [time_major])
    zero = b.const("arith.constant1", np.int32(0))
    zeros_state = b.const("arith.constant", np.zeros((1, units), np.float32))
    loop_in = [zero, zero, b.const(f"{p}/TensorArrayV2_1", np.zeros((1, 1, units), np.float32)), zeros_state,
               zeros_state, time_major]
    loop_out = [b.tensor(f"{p}/while{i or ''}", shape, dtype) for i, (shape, dtype) in enumerate(state_shapes)]
    b.op("WHILE", loop_in, loop_out, cond_subgraph_index=cond_index, body_subgraph_index=body_index)
    last = b.tensor(f"{p}/strided_slice_23", (1, units))
    b.op("STRIDED_SLICE", [loop_out[2], net.int_const(f"{p}/strided_slice_22", [-1, 0, 0]),
                           net.int_const(f"{p}/strided_slice_21", [0, 1, units]),
                           net.int_const(f"{p}/strided_slice_2", [1, 1, 1])],
         [last], begin_mask=6, end_mask=6, shrink_axis_mask=1)
    logits = b.tensor("StatefulPartitionedCall_1:0", (1, 10))
    b.op("FULLY_CONNECTED", [last, b.const("lstm_small_keras3_1/logits_1/MatMul1",
                                           net.glorot((10, units), units, 10)), -1], [logits],
         **_options("FULLY_CONNECTED", {}))
    net.output(Act(logits, (1, 10), "StatefulPartitionedCall_1:0"), "logits")

    # condition: both counters below the step count
    args = [cond.input(f"{p}/while_cond_arg{i}", shape, dtype) for i, (shape, dtype) in enumerate(state_shapes)]
    limit = cond.const(f"{p}/Max1", np.int32(steps))
    less1, less = cond.tensor(f"{p}/while/Less_1", (), np.bool_), cond.tensor(f"{p}/while/Less", (), np.bool_)
    cond.op("LESS", [args[0], limit], [less1])
    cond.op("LESS", [args[1], limit], [less])
    both = cond.tensor(f"{p}/while/LogicalAnd", (), np.bool_)
    cond.op("LOGICAL_AND", [less1, less], [both])
    cond.output(both)

    # body: one LSTM step; gates i, f, g (cell), o in that order
    c = f"{p}/while/lstm_cell_1"
    a = [body.input(f"{p}/while_body_arg{i}", shape, dtype) for i, (shape, dtype) in enumerate(state_shapes)]
    one = body.const("arith.constant2", np.int32(1))
    bias = np.concatenate([np.zeros(units), np.ones(units), np.zeros(2 * units)]).astype(np.float32)

    def op(name: str, inputs, out: str, shape=(1, units), dtype=np.float32, **options) -> int:
        y = body.tensor(out, shape, dtype)
        body.op(name, inputs, [y], **_options(name, options))
        return y

    counter = op("ADD", [a[0], one], f"{p}/while/add_1", (), np.int32)
    step = op("ADD", [a[1], one], f"{p}/while/add", (), np.int32)
    recurrent = op("FULLY_CONNECTED", [a[3], body.const(f"{c}/MatMul_1", net.glorot((4 * units, units), units,
                                                                                      4 * units)), -1],
                   f"{c}/MatMul_11", (1, 4 * units))
    recurrent = op("RESHAPE", [recurrent, body.const(f"{c}/Squeeze", np.int32([4 * units]))], f"{c}/Squeeze1",
                   (4 * units,))
    x_t = op("GATHER", [a[5], a[1]], f"{p}/while/TensorArrayV2Read/TensorListGetItem", (1, features), axis=0)
    z = op("FULLY_CONNECTED", [x_t, body.const(f"{c}/MatMul", net.glorot((4 * units, features), features,
                                                                          4 * units)), -1], f"{c}/MatMul1",
           (1, 4 * units))
    z = op("ADD", [z, recurrent], f"{c}/BiasAdd", (1, 4 * units))
    z = op("ADD", [z, body.const(f"{c}/BiasAdd_1/ReadVariableOp", bias)], f"{c}/BiasAdd_1", (1, 4 * units))
    gates = [body.tensor(f"{c}/split{i or ''}", (1, units)) for i in range(4)]
    body.op("SPLIT", [one, z], gates, num_splits=4)
    i_gate = op("LOGISTIC", [gates[0]], f"{c}/Sigmoid")
    f_gate = op("LOGISTIC", [gates[1]], f"{c}/Sigmoid_1")
    kept = op("MUL", [f_gate, a[4]], f"{c}/mul")
    o_gate = op("LOGISTIC", [gates[3]], f"{c}/Sigmoid_2")
    g_gate = op("TANH", [gates[2]], f"{c}/Tanh")
    cell = op("ADD", [kept, op("MUL", [i_gate, g_gate], f"{c}/mul_1")], f"{c}/add")
    h = op("MUL", [o_gate, op("TANH", [cell], f"{c}/Tanh_1")], f"{c}/mul_2")
    written = op("RESHAPE", [h, body.const(f"{p}/while/TensorArrayV2Write/TensorListSetItem",
                                           np.int32([1, 1, units]))],
                 f"{p}/while/TensorArrayV2Write/TensorListSetItem1", (1, 1, units))
    body.output(counter, step, written, h, cell, a[5])


__all__ = ["Precision", "deeplab_mnv2", "fallback_ops", "lstm_small", "lstm_small_keras3_while", "mobilenet_v1",
           "mobilenet_v2", "opzoo_small", "posenet_mnv1", "ssd_mnv2", "unet_small"]
