#!/usr/bin/env bash
# One call on a lent GPU machine (the workplace's device tool), which has no package registry: set up from
# carried files, then run the named steps in order, each under its own time limit, each logging to $OUT.
#
#   here, once:  bash bench/gpu_prepare.sh   (.gpu/site.tar.xz, .gpu/models, .gl/*.deb; about a minute)
#   there:       bash bench/gpu_session.sh probe tests profile tune bench   (carry: .gpu, .gl)
#
# Steps: probe (device facts, FMA peak), tests (the OpenCL-path tests on the GPU), profile (per-kernel times of
# MobileNet v1 / v2 with the heuristics alone), tune (exhaustive search of every float corpus model; the records
# exported to $OUT/records.json), bench (bench/bench_gpu.py's table), torch (the PyTorch peers alone), sweep
# (bench/gpu_sweep.py: fixed knob points of every conv of six corpus models), launch (bench/launch_cost.py),
# compile (bench/compile_cost.py: a candidate's build cost, apart and 8 in one program), passab (bench/pass_ab.py:
# each launch-saving graph rule off in turn; PASSAB_MODELS, PASSAB_OFF), anatomy
# (bench/invoke_anatomy.py: where an invoke's time goes; ANATOMY_MODELS), ab (bench/launch_ab.py: fused blocks and
# given work-groups and fused expansions against the start, whole plans; ANATOMY_MODELS, AB_VARIANTS), pytest (python -m pytest $PYTEST_ARGS,
# its whole output logged: a failure's traceback), ship (bench's background records folded into the shipped
# database, tflgpu/data/tuning/$RECORDS_NAME.json, for the steps after it; the file copied to $OUT).
#
# With 15 minutes of device time, two calls fit: a machine starts in about 30 s and a call's set-up takes 20 s.
# This one ran in 144 s on an H200 (carry .gpu and .gl, whose Vulkan loader debs LiteRT's GPU path needs):
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig;
#   PROFILE_MODELS="mobilenet_v1_1.0_224.tflite mobilenet_v2_1.0_224.tflite fallback_ops.tflite" PROFILE_LIMIT_S=60
#   TESTS_K="softmax or topk or gather or gpu_defaults" TESTS_LIMIT_S=60 BENCH_LIMIT_S=80 TUNE_BUDGET_S=5 BG_WAIT_S=20
#   ROUNDS=20 BENCH_ARGS=--no-torch BENCH_MODELS="/tmp/models/mobilenet_v2_1.0_224.tflite ..." SWEEP_DEADLINE_S=55
#   SWEEP_MODELS="mobilenet_v1_1.0_224.tflite mobilenet_v2_1.0_224.tflite" RECORDS_NAME=nvidia-h200
#   bash bench/gpu_session.sh profile gputests bench sweep
# On an H100 (2026-11-26, three calls): the group tiles (pointwise, implicit GEMM) and image weights pass the
# GPU-path tests there (image weights after the sampler fix), as do the cadence and dense-boundary tests; the flush
# cadence changes nothing on NVIDIA (the driver submits at once: every candidate within 1%). Not yet run on a GPU:
# sub-group reductions and the broadcast GEMM (no sub-groups in NVIDIA's OpenCL 1.2), FP16 arithmetic (no
# cl_khr_fp16 there). Next: `ab` (fusing the split separable blocks, explicit work-groups for the kernels launched
# without one: NVIDIA's enqueue costs ~5 us more there, `anatomy`'s per-launch table; and fuse_expansions, one
# kernel per MobileNet v2 block: 43 launches -> 20; ANATOMY_MODELS may add deeplab_mnv2_257.tflite and
# ssd_mnv2_300.tflite), `bench` with BENCH_ARGS="--no-torch --fuse-expansions" beside the default's, the speed of the
# implicit-GEMM group tiles (SWEEP_MODELS="unet_small_256.tflite deeplab_mnv2_257.tflite"), and bench rows for the
# float corpus models not timed since pinned I/O.
# The third call: TESTS_K="group_tile or image_weights or work_group or half_math or broadcast_variant or
# gpu_defaults or cadence or dense_boundary" TESTS_LIMIT_S=70 TUNE_BUDGET_S=5 BG_WAIT_S=15 ROUNDS=20
# BENCH_ARGS=--no-torch BENCH_LIMIT_S=140 BENCH_MODELS="..."; bash bench/gpu_session.sh gputests launch anatomy bench
# Since then (no GPU): the tuner costs a candidate the longer of its device span and its host enqueues, tries the
# launch knobs (fused, local_size, group_tile) first where the default is host-bound, and searches the convs of
# an unfused block as kernels of their own; so `bench`'s background column is where a host-bound GPU plan should
# now gain (BG_WAIT_S=60 lets MobileNet's search finish: ~20 kernels x 10 candidates x ~0.13 s compile on NVIDIA).
# The next session's first call (about 8 minutes): the new kernels' GPU tests, then the launch-level A/B of whole
# plans on the four MobileNet-family models:
#   TESTS_K="separable or pooled_dense or gpus_defaults or host" TESTS_LIMIT_S=120
#   ANATOMY_MODELS="mobilenet_v1_1.0_224.tflite mobilenet_v2_1.0_224.tflite deeplab_mnv2_257.tflite
#   ssd_mnv2_300.tflite" bash bench/gpu_session.sh gputests ab
# then, with the variants that won made the default, `bench` over every float corpus model (BENCH_MODELS unset).
# That call (2026-11-27, H100): neither fused blocks (0.73x) nor fused expansions (0.34x) nor work-groups (1.00x)
# paid; the deep pointwise convs' serial sums did (k_split: 7x7 960 -> 160 39 -> 14 us, SWEEP_MODELS=
# SWEEP_POINTWISE="7x7x960x160 ..." RECORDS_NAME=pointwise-split, 68 s). Next: `bench` of MobileNet v1 / v2 with
# the split default and records (its effect end to end), then a sweep of the other models' deep pointwise shapes
# (DeepLab, SSD, PoseNet) into the shipped records, whose older entries there still hold unsplit tiles.
# Since then (no GPU): a kernel's constant arrays are one buffer (kernels.program.const_pack: MobileNet v2's GPU plan
# 4.7 -> 3.2 buffers a launch); `ab`'s "unpacked" variant times the plan without it, `launch` an empty kernel through
# one buffer and int offsets against 4 / 8 buffers (would tensors bound as offsets into one arena pay too?). The
# next session's first call (about 9 minutes; carry .gpu and .gl):
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; TESTS_K="shares or group_tile_variant or const_pack or
#   packed" TESTS_LIMIT_S=90 BG_WAIT_S=60 TUNE_BUDGET_S=10 ROUNDS=20 BENCH_ARGS=--no-torch BENCH_LIMIT_S=260
#   BENCH_MODELS="/tmp/models/mobilenet_v1_1.0_224.tflite /tmp/models/mobilenet_v2_1.0_224.tflite" AB_LIMIT_S=150
#   bash bench/gpu_session.sh gputests launch bench ab
# and the second: BENCH_MODELS over the other float corpus models with BG_WAIT_S=20, then the deep pointwise sweep
# (SWEEP_MODELS="deeplab_mnv2_257.tflite ssd_mnv2_300.tflite posenet_mnv1_257.tflite" RECORDS_NAME=more).
# This session's three H100 calls (2026-11-27, 15 minutes): packed constants pass the GPU tests and change nothing
# end to end (ab "unpacked" 1.00x: MobileNet v2's plan is bound by the device, not the host: anatomy's gated device
# time 582 us of a 728 us invoke, its enqueues 452 us); launch: 5.6 us of device time per launch even for an empty
# kernel queued behind a gate (100 in a row), so each launch a plan saves is worth that much of the device; bench
# rows for MobileNet v1 / v2, DeepLab, SSD and UNet (PoseNet was cut by the step's limit twice: give it a call of
# its own). The next call: BENCH_MODELS="/tmp/models/posenet_mnv1_257.tflite ..." bash bench/gpu_session.sh bench,
# then fold its background-records.json into tflgpu/data/tuning/nvidia-h100.json (bench/merge_records.py): on
# the H100 the background search took MobileNet v2 0.757 -> 0.631 ms and UNet 1.206 -> 0.896 over the start.
# In one call (bench's row per model also notes its seconds by phase and its 8 slowest kernels):
#   BG_WAIT_S=120 TUNE_BUDGET_S=5 ROUNDS=20 BENCH_ARGS=--no-torch BENCH_LIMIT_S=330 BENCH_MODELS="...MobileNet v1 / v2,
#   UNet, PoseNet" bash bench/gpu_session.sh bench ship, then a second call: BENCH_LIMIT_S=... bench (the start
#   column from the merged records; copy $OUT/nvidia-h100.json over the shipped file and commit it).
# Since (2026-11-27, no GPU): the group tiles' `prefetch` knob, and a GPU plan's cadence trial also trying launches
# with no event each (runtime.enqueue), both untimed; and an expansion with its depthwise conv as one kernel
# (kernels.expand_depthwise: MobileNet v2's 576 / 960-channel blocks, 43 -> 37 launches), untimed.
# Device time is now 15 minutes a session, starts included. The next GPU session (rebuild .gpu and .gl here first
# with bench/gpu_prepare.sh: a fresh checkout lacks them; carry both), first call about 9 minutes, the issue's
# open rows and the question under them:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig;
#   TESTS_K="prefetch or cadence or enqueue or expand_depthwise or densely or reshaped_convs or prelu or
#   fused_ops_after or unary or fused_blocks or prologue or simulator_grid or sibling" TESTS_LIMIT_S=110
#   ANATOMY_MODELS=mobilenet_v2_1.0_224.tflite BG_WAIT_S=90 TUNE_BUDGET_S=5 ROUNDS=20 BENCH_ARGS=--no-torch
#   BENCH_LIMIT_S=300 BENCH_MODELS="/tmp/models/mobilenet_v2_1.0_224.tflite /tmp/models/posenet_mnv1_257.tflite"
#   RECORDS_NAME=nvidia-h100 bash bench/gpu_session.sh gputests launch anatomy bench ship
# (the new kernels on the GPU; `launch` and `anatomy`: whether NVIDIA's 5.6 us of device time per launch is its
# bookkeeping of pyopencl's events (the gated rows with no event per launch), and whether its final wait sleeps
# (anatomy's wait rows: finish, the read's event, that event polled); the MobileNet v2 and PoseNet rows, whose
# background search tries each fused expansion first; its records folded into the shipped file, copied to $OUT:
# commit it here.) The second call, about 4 minutes, what is left: the rows of the models whose launches went since
# the last table (U-Net's PReLUs fused: 37 -> 23; SSD's head one kernel per output: 52 -> 47) and the PyTorch
# peers the issue's table names (torchvision is in the image):
#   BG_WAIT_S=30 TUNE_BUDGET_S=3 ROUNDS=20 BENCH_ARGS=--no-torch BENCH_LIMIT_S=200
#   BENCH_MODELS="/tmp/models/unet_small_256.tflite /tmp/models/ssd_mnv2_300.tflite" bash bench/gpu_session.sh bench torch
# Whole-plan A/B (AB_VARIANTS=queued,direct,expand-dw ... ab) and the sweep of prefetch and the head's groups
# (SWEEP_MODELS=mobilenet_v2_1.0_224.tflite SWEEP_DEADLINE_S=240 ... sweep) wait for a later session, as does
# `passab` (bench/pass_ab.py on the GPU: the launch-saving graph rules one at a time against the plan, interleaved
# with LiteRT's CPU: the int8 MobileNet v2's input prologue and simulator clamps, U-Net's PReLUs, SSD's head).
# That session (2026-11-27, H100, 11 minutes of device time in three calls: `gputests bench ship launch anatomy`
# 239 s, `bench passab torch` 214 s, `bench ship` 158 s; README's table): the new kernels' GPU tests pass; MobileNet
# v2 0.454-0.534 ms; MobileNet v1 0.599 after its background search fused its projection + depthwise pairs (since:
# kernels.expand_depthwise.MAX_INPUTS, and autotune.measure.step_cost in place of max(host, device); both untimed).
# The next session's first call (about 7 minutes), the A/B of the search's cost and MobileNet v1's row:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; BG_WAIT_S=45 TUNE_BUDGET_S=3 ROUNDS=30
#   BENCH_ARGS=--no-torch BENCH_LIMIT_S=200 BENCH_MODELS="/tmp/models/mobilenet_v1_1.0_224.tflite
#   /tmp/models/mobilenet_v2_1.0_224.tflite /tmp/models/deeplab_mnv2_257.tflite" bash bench/gpu_session.sh bench;
#   BENCH_ARGS="--no-torch --host-share 1" ... bash bench/gpu_session.sh bench
# (the second bench's background column is the old cost's; both start from the shipped records); then `ship` after
# the better one's bench, and a second call for the other corpus models' rows. Put TESTS_K="tflites_zeros or
# clamped_negative or lent_only or device_time_under" gputests first (TFLite's clamps as compare-and-select on
# NVIDIA's compiler; the cost and transfer rules' tests).
# Since (2026-11-28, no GPU): bench's table splits (wall - kernels) per launch by the device clock
# (benchmark.LaunchStats: the host outside the device's span / the device idle between commands / the boundary
# copies and conversions, now device commands of a profiled run): whether what is left over 3 us a launch is the
# host's or NVIDIA's gap between kernels and the PCIe copies (DeepLab reads 5.5 MB back). Add "split_the_host_time"
# to TESTS_K; the SSD head's reshaped reads divide once per slice (kernels.reindex._through), untimed there.
# Since (2026-11-28, second session, no GPU): 22 more op types have OpenCL kernels (README "On an OpenCL device"),
# and comparisons store +0.0 for false; their tests have not run on a GPU. Add to the first call's TESTS_K:
#   "unary or gelu or step_functions or more_binary or mask_cast or select or extremes or log_softmax or
#   spatial_mean_work_group or softmax_work_group_rows or test_pool or mirror_pad or tile_broadcast or
#   pack_and_unpack or space_to_batch or gather_nd or per_token or last_axis or special_values"
# (per_token: a transformer's FC as a 1x1 conv, so the GPU's pointwise GEMM; a bench of /tmp/ln_mlp.tflite-like
# blocks, made by a script like the session note's, would show what a transformer block costs there.)
# (NVIDIA's pow / erfc / atan2 are within their ulp bounds of LiteRT's; FLOOR_MOD's fmod is exact there too).
# Since (2026-11-28, third session, no GPU): .gpu/models also holds MediaPipe's 14 released models as stand-ins
# (gpu_prepare.sh), real deployed graphs (BlazeFace, face mesh, hands, iris, BlazePalm, BlazePose, selfie
# segmentation): a second call's bench over a few of them (BENCH_MODELS="/tmp/models/face_landmark.tflite
# /tmp/models/hand_landmark_full.tflite /tmp/models/selfie_segmentation.tflite /tmp/models/iris_landmark.tflite"
# BG_WAIT_S=20 ROUNDS=20 BENCH_ARGS=--no-torch) is the first GPU figure on models users run; add "mediapipe"
# to TESTS_K (tests/test_released_models.py needs the real files: TFLGPU_MEDIAPIPE_DIR pointing at a carried
# copy, 28 MB, else its tests skip there). The FP16 precision choice now also simulates a jittered rounding and
# judges probability outputs against 1 (runtime.precision): NVIDIA has no fp16, so nothing to time there.
# Since (2026-11-28, fourth session, no GPU): a fused ADD reads a channel PAD and a MAX_POOL through (a BlazeBlock's
# skip branch is one kernel with its conv), a step moves before a producer to make its fused op's operand in time,
# TRANSPOSE_CONV has a scatter form where its filter tiles the output (in a GPU's space; its start stays gather),
# and a graph input one kernel reads twice keeps the slice layout (a silent 5.7 error before). Add to TESTS_K
# "channel_pad or scatter or also_adds"; the MediaPipe bench rows above show the launches these save on a GPU
# Since (2026-11-29, no GPU): the background search ends with the winners timed together against the start's
# kernels (runtime.upgrades.check_plan; bench's note per model says which stayed): MobileNet v1's 0.599 ms after
# its search against 0.525 at its start (2026-11-27) is the case it takes back. And no shipped record is of the
# current generator version (a hash of tflgpu/kernels: every kernel change since stales them), so the start uses
# them only through their families (exchange.NearestRecords._shipped_family, the same kernel at distance 0). `bench`
# now also exports its exhaustive searches' records, and `ship` folds them in beside the background's (more trials
# win): the start then begins where exhaustive tuning ended, on MobileNet v1 0.302 ms against 0.525. First call:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; TESTS_K="put_back or start_as_its or channel_pad or
#   scatter or also_adds" TESTS_LIMIT_S=90 BG_WAIT_S=45 TUNE_BUDGET_S=20 ROUNDS=30 BENCH_ARGS=--no-torch
#   BENCH_LIMIT_S=330 BENCH_MODELS="/tmp/models/mobilenet_v1_1.0_224.tflite /tmp/models/mobilenet_v2_1.0_224.tflite"
#   RECORDS_NAME=nvidia-h200 bash bench/gpu_session.sh gputests bench ship
# then a second call's `bench` of the same models shows the start from the shipped records (copy $OUT's
# nvidia-h200.json over the shipped file and commit it).
# (BlazeFace short range 50 -> 39 on the CPU device; `passab` with PASSAB_OFF=channel-pad,pool-read,hoist times each).
# Since (2026-11-28, fifth session, no GPU): a squeeze-and-excitation gate (spatial mean, two dense ops) is one
# kernel (graph.passes.fuse_gates, kernels.pooled_dense.gate; a GPU's start fused, its search tries the three
# kernels) and its MUL folds into the conv after it (fold_gate_scales: selfie segmentation 79 -> 55 launches), and
# a transposed conv of fewer than 4 channels sums its (tap, channel) values as lanes (kernels.conv.narrow_scatter)
# and writes a graph output densely. Add "gate or narrow or
# whole_image" to TESTS_K, and PASSAB_MODELS=selfie_segmentation.tflite PASSAB_OFF=gates,gate-scales,narrow-scatter
# to a call's `passab` (the gate's fused kernel against three launches, where each launch costs 5.6 us of device).
# Since (2026-11-28, sixth session, no GPU): a channel concatenation branches per output slice, a reduction of each
# image over every other axis runs on the device, a direct conv of fewer than 4 output channels sums dot products,
# and .gpu/models holds Basic Pitch (nmp.tflite; tflgpu.zoo.released). Add "channel_concatenation or
# over_each_image or narrow_output" to TESTS_K, and /tmp/models/nmp.tflite to a MediaPipe bench call's
# BENCH_MODELS (an audio model: 1-D convs of 256 taps, a 3 x 39 conv, 144 launches on the CPU device).
# Since (2026-11-29, second session, no GPU): BATCH_MATMUL by a constant matrix runs on the device (the tiled form),
# float literals go through kernels.common.c_float (+-inf and NaN as OpenCL C's constants), and .gpu/models holds
# openWakeWord's 8 (gpu_prepare.sh). Add "batch_matmul_by or open_ended or dynamic_input_stored" to the first call's
# TESTS_K. Timing the wake-word classifiers there can wait: LiteRT's CPU runs each in 10-20 us, so a device's fixed
# cost per invoke decides them (0.12-0.17 ms on the Intel CPU device, most of it that cost).
# Since (2026-11-29, third session, no GPU): pooling's float4-a-work-item form (a GPU's) unrolls a window inside the
# image, a layer norm's seven ops are one kernel (graph.passes.fuse_layer_norms: kernels.pool's row form, a
# work-group a row on a GPU), and a CPU device's windowed convs take 12 / 6-slice tiles where 8 would be ragged
# (not a GPU's tiles), and a graph input read only by a RESHAPE is read densely by it. Add "pool_forms or layer_norm
# or reshaped_graph_input" to the first call's TESTS_K.
# Since (2026-11-29, fourth session, no GPU): an STFT's spectrum runs on the device (graph.passes.fuse_spectra,
# kernels.spectral: a work-group a frame in local memory on a GPU, the default there, never run on one), a swish is
# its producer's activation (fuse_swish), moves in a
# row are one kernel (fold_moves), and elementwise kernels of one-pixel rows run along the slices first. Add
# "spectrum or moves_in_a_row or read_twice or one_pixel_rows or swish" to the first call's TESTS_K. BirdNET 2.4 (51 MB,
# `python -m tflgpu.zoo DIR --release birdnet`) does not fit the carry beside the wheels; its spectrum's shape is
# in those tests (511 frames of 2,048 samples).
# Since (2026-12-01, no GPU): a lane kernel's constant operand is uploaded in its slice layout (a CONCATENATION of a
# folded FILL and a signal runs on the device), and the direct conv may read its input lanes one by one from memory
# where a tile lies inside the image (ConvKnobs.mem_lanes: a 16-lane CPU device's FP32 default for windowed convs;
# in a GPU's space, untimed there). Add "concatenation_of or register_tiles" to the first call's TESTS_K; `sweep`
# now times two conv points with mem_lanes=True (whether a GPU's direct kernel gains from it).
# Since (2026-12-05, no GPU): a direct conv over one input slice of 1-3 channels (a GPU's RGB stems: its default is
# the direct kernel, 2 strided pixels) holds only those lanes in its weights (weights_oi(in_lanes=)), and a
# conv of at most 8 output channels over rows of 9+ taps has a CPU device's form of its own (ConvKnobs.signal: not
# in a GPU's space; a test can force it). Add "thin_inputs or signal" to the first call's TESTS_K (test_signal forces each of its points
# through plan_with_params: on NVIDIA, whether its private window compiles and matches LiteRT).
# Since (2026-12-05, second session, no GPU): shipped records are found by op and precision and by whether the
# kernel's generator takes their point (autotune.tuner.KernelTraits), no longer by a hash of its space's lists. On
# the H100's target the shipped file now starts U-Net's three transposed convs and three of DeepLab's deep convs
# (the heuristics before), and MobileNet v1's 512- and 1,024-channel separable blocks start unfused from the H200's
# records of their own shapes (before: the knobs of the H100's records of 14x14x384 / 10x10x576 blocks). The next
# `bench` rows of U-Net, DeepLab and MobileNet v1 show what that start is worth.
# Since (2026-12-06, no GPU): the tests above that compare two plans' values exactly waited for nothing, so under
# gputests' tiered starts the quick build (no optimizations) met an optimized one: 8 of them failed here by 1e-6
# (conftest.on_optimized_code now waits). Every keyword the paragraphs above add to TESTS_K since the last GPU call
# is NEW_TESTS_K below (1,269 tests here; 3 minutes on the 2-core CPU device, all passing with tiered starts). The
# next GPU session's first call (about 8 minutes; rebuild .gpu and .gl with bench/gpu_prepare.sh, carry both):
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; TESTS_LIMIT_S=180 BG_WAIT_S=45 TUNE_BUDGET_S=5 ROUNDS=20
#   BENCH_ARGS=--no-torch BENCH_LIMIT_S=240 BENCH_MODELS="/tmp/models/mobilenet_v1_1.0_224.tflite
#   /tmp/models/mobilenet_v2_1.0_224.tflite" RECORDS_NAME=nvidia-h100 bash bench/gpu_session.sh newtests bench ship
# (where newtests runs out of time, its log's last lines say how far it got: give the rest a call of its own), and
# the second: the other float corpus models' rows (BENCH_MODELS unset, BG_WAIT_S=20) and `torch`.
# Since (2026-12-07, no GPU): bound buffers stay bound across resizes (one context per interpreter), and
# experimental_preserve_all_tensors=True makes every tensor an op writes an output of the plan, read back from the
# device: "bound_buffers_across or preserve_all_tensors" joined NEW_TESTS_K (on a GPU, the second shows which layer
# a device computes differently from LiteRT, should one ever do so).
set -u
export OUT=${OUT:-/tmp/out}
# (the tests added since the last GPU call: `newtests` runs gputests with these)
NEW_TESTS_K="tflites_zeros or clamped_negative or lent_only or device_time_under or split_the_host_time or unary"
NEW_TESTS_K+=" or gelu or step_functions or more_binary or mask_cast or select or extremes or log_softmax"
NEW_TESTS_K+=" or spatial_mean_work_group or softmax_work_group_rows or test_pool or mirror_pad or tile_broadcast"
NEW_TESTS_K+=" or pack_and_unpack or space_to_batch or gather_nd or per_token or last_axis or special_values"
NEW_TESTS_K+=" or mediapipe or channel_pad or scatter or also_adds or put_back or start_as_its or gate or narrow"
NEW_TESTS_K+=" or whole_image or channel_concatenation or over_each_image or narrow_output or batch_matmul_by"
NEW_TESTS_K+=" or open_ended or dynamic_input_stored or pool_forms or layer_norm or reshaped_graph_input or spectrum"
NEW_TESTS_K+=" or moves_in_a_row or read_twice or one_pixel_rows or swish or concatenation_of or register_tiles"
NEW_TESTS_K+=" or thin_inputs or signal or prefetch or cadence or enqueue or expand_depthwise or densely"
NEW_TESTS_K+=" or reshaped_convs or prelu or fused_ops_after or fused_blocks or prologue or simulator_grid or sibling"
NEW_TESTS_K+=" or bound_buffers_across or preserve_all_tensors"
if [ "${1:-}" != --inner ]; then
    mkdir -p /tmp/site "$OUT"
    tar -C /tmp/site -xJf .gpu/site.tar.xz || exit 1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TFLGPU_MODELS_DIR=/tmp/models
    export TFLGPU_CACHE_DIR=/tmp/tflgpu-cache TFLGPU_DEVICE=${TFLGPU_DEVICE:-NVIDIA}
    icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json  # (LiteRT's GPU path: WebGPU over Vulkan)
    [ -f $icd ] && export VK_DRIVER_FILES=$icd
    egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    [ -f $egl ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
    python3 bench/standin_models.py unpack .gpu/models /tmp/models >/dev/null || exit 1
fi
M=/tmp/models
tflgpu() { python3 -m tflgpu.cli "$@"; }

step() {  # step NAME SECONDS COMMAND...: run with a time limit, output to the console and $OUT/NAME.log
    local name=$1 limit=$2; shift 2
    echo "=== $name ($(date +%T), limit ${limit}s)"
    timeout "$limit" bash "$0" --inner "$@" 2>&1 | tee "$OUT/$name.log"
    echo "=== $name rc=${PIPESTATUS[0]} ($(date +%T))"
}

probe() {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
    python3 -c "import numpy, numba, pyopencl; print('numpy', numpy.__version__, 'numba', numba.__version__, 'pyopencl', pyopencl.VERSION_TEXT)"
    tflgpu inspect --devices
    python3 - <<'EOF'
from tflgpu.runtime.icd import ensure_icd_vendors
ensure_icd_vendors()
import pyopencl as cl
from tflgpu.benchmark import fma_peak_gflops
for p in cl.get_platforms():
    for d in p.get_devices():
        print(p.name, '|', d.name, '|', d.driver_version, '|', d.version, '| CUs', d.max_compute_units,
              '| wg', d.max_work_group_size, '| local', d.local_mem_size, '| images', d.image_support,
              '| vec float', d.native_vector_width_float)
        print('  extensions:', d.extensions)
print('FMA peak GFLOP/s:', round(fma_peak_gflops()))
EOF
}

tests() {
    python3 -m pytest -q -x -n 8 -p no:cacheprovider tests/test_gpu_ops.py tests/test_ops_conv.py \
        tests/test_gpu_corpus.py tests/test_layers.py tests/test_precision.py 2>&1 | tail -40
}

profile() {  # (PROFILE_MODELS: names under the models dir)
    for m in ${PROFILE_MODELS:-mobilenet_v1_1.0_224.tflite mobilenet_v2_1.0_224.tflite}; do
        TFLGPU_TUNING=none tflgpu bench "$M/$m" --profile --repeat 30
    done
}

tune() {  # (bench_gpu's float corpus models)
    local models
    models=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import bench_gpu; print(' '.join('$M/' + n for n in bench_gpu.FLOAT_MODELS))")
    # shellcheck disable=SC2086
    tflgpu tune $models --mode exhaustive --budget-s "${TUNE_BUDGET_S:-25}" --export "$OUT/records.json" -q
}

bench() {
    # shellcheck disable=SC2086
    # (the background searches' records come back as one export file: bench/merge_records.py folds them into
    # the shipped database, tflgpu/data/tuning, so a fresh cache on this device starts where they ended)
    python3 bench/bench_gpu.py --exhaustive-budget-s "${TUNE_BUDGET_S:-25}" --background-wait-s "${BG_WAIT_S:-60}" \
        --rounds "${ROUNDS:-30}" --export-background "$OUT/background-records.json" \
        --export-exhaustive "$OUT/exhaustive-records.json" ${BENCH_ARGS:-} ${BENCH_MODELS:-}
}

sweep() {
    # each kernel's best point becomes this device's shipped records (tflgpu/data/tuning), read by later steps
    mkdir -p tflgpu/data/tuning
    # (SWEEP_POINTWISE: lone 1x1 convs, HxWxCINxCOUT, swept too; SWEEP_MODELS= none of the models)
    local models=${SWEEP_MODELS-mobilenet_v1_1.0_224.tflite mobilenet_v2_1.0_224.tflite deeplab_mnv2_257.tflite
                                  posenet_mnv1_257.tflite ssd_mnv2_300.tflite unet_small_256.tflite}
    # shellcheck disable=SC2046,SC2086
    python3 bench/gpu_sweep.py --out "$OUT/sweep.jsonl" --deadline-s "${SWEEP_DEADLINE_S:-300}" \
        --records "tflgpu/data/tuning/${RECORDS_NAME:-gpu}.json" $(for m in $models; do echo "$M/$m"; done) \
        ${SWEEP_POINTWISE:+--pointwise $SWEEP_POINTWISE}
    cp "tflgpu/data/tuning/${RECORDS_NAME:-gpu}.json" "$OUT/"
}

gputests() {  # tiered compiles as a user's start has them (the suite's default is off); TESTS_K: pytest's -k
    TFLGPU_TIERED_COMPILE=${TFLGPU_TIERED_COMPILE:-1} python3 -m pytest -q -n 12 -p no:cacheprovider \
        ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu_ops.py tests/test_gpu_corpus.py tests/test_cadence.py tests/test_enqueue.py \
        tests/test_dense_boundary.py tests/test_separable.py tests/test_separable_expand.py tests/test_pooled_dense.py \
        tests/test_autotune.py tests/test_const_pack.py tests/test_expand_depthwise.py tests/test_quantized.py \
        tests/test_siblings.py tests/test_ops_elementwise.py tests/test_exchange.py tests/test_fuzz_valid.py \
        tests/test_cli.py tests/test_gates.py tests/test_released_models.py 2>&1 \
        | grep -v "^SKIPPED" | tail -30
}

ship() {  # the last bench step's records, its exhaustive searches' and its background searches', folded into the
    # shipped database (RECORDS_NAME; a kernel's record from more trials wins: the exhaustive one, mostly), which
    # later steps of this call read: a second bench's start column then shows what a fresh cache gets from them
    local db="tflgpu/data/tuning/${RECORDS_NAME:-nvidia-h100}.json" f files=()
    for f in "$OUT/exhaustive-records.json" "$OUT/background-records.json" "$OUT/records.json"; do
        [ -f "$f" ] && files+=("$f")
    done
    python3 bench/merge_records.py "$db" "${files[@]}" && cp "$db" "$OUT/"
}

torch_peers() { python3 -c "import sys; sys.argv=['x']; sys.path.insert(0, 'bench'); import bench_gpu; print('\n'.join(bench_gpu.torch_table(30)))"; }

if [ "${1:-}" = --inner ]; then
    "${@:2}"
    exit
fi
for s in "$@"; do
    case $s in
        probe) step probe 120 probe ;;
        tests) step tests "${TESTS_LIMIT_S:-240}" tests ;;
        gputests) step gputests "${TESTS_LIMIT_S:-240}" gputests ;;
        newtests) TESTS_K=$NEW_TESTS_K step newtests "${TESTS_LIMIT_S:-240}" gputests ;;
        profile) step profile "${PROFILE_LIMIT_S:-120}" profile ;;
        tune) step tune "${TUNE_LIMIT_S:-330}" tune ;;
        bench) step bench "${BENCH_LIMIT_S:-400}" bench ;;
        torch) step torch 120 torch_peers ;;
        sweep) step sweep "$(( ${SWEEP_DEADLINE_S:-300} + 60 ))" sweep ;;
        launch) step launch 60 python3 bench/launch_cost.py ;;
        ship) step ship 60 ship ;;
        ab) step ab "${AB_LIMIT_S:-240}" python3 bench/launch_ab.py ${AB_VARIANTS:+--variants "$AB_VARIANTS"} $(printf "$M/%s " ${ANATOMY_MODELS:-mobilenet_v1_1.0_224.tflite mobilenet_v2_1.0_224.tflite}) ;;
        anatomy) step anatomy 150 python3 bench/invoke_anatomy.py $(printf "$M/%s " ${ANATOMY_MODELS:-mobilenet_v1_1.0_224.tflite mobilenet_v2_1.0_224.tflite}) ;;
        pytest) step pytest "${TESTS_LIMIT_S:-240}" python3 -m pytest -p no:cacheprovider ${PYTEST_ARGS:-} ;;
        compile) step compile 90 python3 bench/compile_cost.py "$M/mobilenet_v2_1.0_224.tflite" ;;
        passab) step passab "${AB_LIMIT_S:-240}" python3 bench/pass_ab.py --rounds "${ROUNDS:-30}" \
            --off "${PASSAB_OFF:-between,prelu,concat-views,input-prologue,sim-clamp}" $(printf "$M/%s " \
            ${PASSAB_MODELS:-mobilenet_v2_1.0_224_int8.tflite unet_small_256.tflite ssd_mnv2_300.tflite}) ;;
        *) echo "unknown step $s" ;;
    esac
done
