"""The blocked convolutions in bfloat16 (``precision="bf16"``, nncc/native/conv_bf16.py):
within the bound bfloat16 rounding gives against a float64 convolution, and equal up to
float32 sums to the convolution of the inputs rounded by ml_dtypes (an independent
rounding); built only where vdpbf16ps pays (nncc.native.precision.SLOW_DOT), reported as
bfloat16 layers, and kept float32 for the layers precision auto keeps.

The bound, per output, for inputs rounded to 8 significant bits and float32 sums of the T
taps (input channels x kernel), a bias and a rounding: ``(2 * 2^-8 + 2^-16 + (T + 2) *
2^-24) * sum |x * w|`` over the output's taps (tests/native_fuzz_cases.conv_terms).
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nncc
from nncc.native import precision, toolchain
from nncc.native.precision import arithmetic, why_not_bf16
from nncc.native.toolchain import find_toolchain
from nncc.preparing.calibration import low_layers
from tests.native_fuzz_cases import conv_terms

needs_bf16 = pytest.mark.skipif(find_toolchain() is None or why_not_bf16("native") is not None,
                                reason="no C compiler, or this CPU lacks avx512_bf16 (the convolutions then stay "
                                       "float32, as the float32 tests check)")

# (C, K, H, W, kernel, stride, pad, dilation, group, bias, activation): 1x1 over one long
# row, 1x1 strided, 3x3, 5x5 dilated, channel counts with every kind of last block (odd:
# a half pair), whole-block groups
CONVS = [(64, 32, 9, 9, 1, 1, 0, 1, 1, True, "Relu"), (33, 17, 11, 7, 1, 2, 0, 1, 1, False, ""),
         (20, 48, 10, 12, 3, 1, 1, 1, 1, True, ""), (47, 16, 9, 9, 3, 2, 1, 1, 1, True, "Relu"),
         (17, 5, 12, 12, 5, 1, 4, 2, 1, False, "Relu"), (32, 32, 8, 8, 3, 1, 1, 1, 2, True, "")]


def conv_model(tmp_path):
    rng = np.random.default_rng(3)
    nodes, inits, inputs, outputs, cases = [], [], [], [], {}
    for i, (c, k, h, w, kk, s, p, d, g, bias, act) in enumerate(CONVS):
        x = rng.standard_normal((1, c, h, w)).astype(np.float32)
        wt = (rng.standard_normal((k, c // g, kk, kk)) / np.sqrt(c * kk * kk)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32) if bias else np.zeros(k, np.float32)
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(x.shape)))
        inits.append(numpy_helper.from_array(wt, f"w{i}"))
        ins = [f"x{i}", f"w{i}"]
        if bias:
            inits.append(numpy_helper.from_array(b, f"b{i}"))
            ins.append(f"b{i}")
        attrs = dict(kernel_shape=[kk, kk], strides=[s, s], pads=[p] * 4, dilations=[d, d], group=g)
        nodes.append(helper.make_node("Conv", ins, [f"y{i}"], **attrs))
        out = f"y{i}"
        if act:
            nodes.append(helper.make_node(act, [out], [f"a{i}"]))
            out = f"a{i}"
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
        cases[out] = (x, wt, b, attrs, act)
    model = helper.make_model(helper.make_graph(nodes, "convs", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "convs.onnx")
    onnx.save(model, path)
    return path, cases


def conv64(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    """The convolution in float64 (signed: conv_terms sums absolute values, so split w)."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    pos = conv_terms(np.maximum(x64, 0), np.maximum(w64, 0), attrs) + conv_terms(np.minimum(x64, 0),
                                                                                 np.minimum(w64, 0), attrs)
    neg = conv_terms(np.maximum(x64, 0), np.minimum(w64, 0), attrs) + conv_terms(np.minimum(x64, 0),
                                                                                 np.maximum(w64, 0), attrs)
    return pos - neg + b.astype(np.float64)[None, :, None, None]


def activated(y: np.ndarray, act: str) -> np.ndarray:
    return np.maximum(y, 0) if act == "Relu" else y


@pytest.fixture
def fast_dot(monkeypatch):
    """The host as a CPU whose vdpbf16ps pays (Zen 4): SLOW_DOT left out of its features."""
    real = toolchain._host_features()
    monkeypatch.setattr(toolchain, "_host_features", lambda: real - {precision.SLOW_DOT})


@pytest.mark.slow
@needs_bf16
def test_bf16_convolutions_are_within_the_bound_of_float64_and_round_like_ml_dtypes(tmp_path, fast_dot):
    path, cases = conv_model(tmp_path)
    compiled = nncc.compile_model(path, precision="bf16")
    packed = [s.name for s in compiled.plan.slots if s.name.startswith("w") and "#" in s.name]
    assert len(packed) == len(CONVS) and all(name.endswith("bf16") for name in packed), packed
    assert sorted(low_layers(compiled.plan)) == sorted(f"w{i}" for i in range(len(CONVS)))
    got = compiled.run({f"x{i}": cases[name][0] for i, name in enumerate(cases)})
    exact = 0
    for name, (x, w, b, attrs, act) in cases.items():
        taps = w.shape[1] * w.shape[2] * w.shape[3]
        terms = conv_terms(x, w, attrs)
        want = activated(conv64(x, w, b, attrs), act)
        err = np.abs(got[name].astype(np.float64) - want)
        limit = (2 * 2.0**-8 + 2.0**-16 + (taps + 2) * 2.0**-24) * terms + 2.0**-22 * np.abs(want) + 1e-30
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}"
        # the independent rounding: both operands to bfloat16 by ml_dtypes, exact products
        xr = x.astype(ml_dtypes.bfloat16).astype(np.float32)
        wr = w.astype(ml_dtypes.bfloat16).astype(np.float32)
        rounded = activated(conv64(xr, wr, b, attrs), act)
        off = np.abs(got[name].astype(np.float64) - rounded)
        assert (off <= (taps + 2) * 2.0**-24 * terms * 1.1 + 2.0**-21 * np.abs(rounded) + 1e-30).all(), \
            f"{name}: {off.max():.3g} from the bfloat16-rounded convolution"
        exact += int(np.allclose(got[name], want, rtol=2.0**-20, atol=2.0**-20 * np.abs(want).max()))
    assert exact == 0, "a convolution was computed in float32"


@pytest.mark.slow
@needs_bf16
def test_convolutions_stay_float32_where_kept_or_where_vdpbf16ps_is_slow(tmp_path, monkeypatch):
    path, _ = conv_model(tmp_path)
    real = toolchain._host_features()
    monkeypatch.setattr(toolchain, "_host_features", lambda: real | {precision.SLOW_DOT})
    slow = nncc.compile_model(path, precision="bf16")
    # on AMX tiles every ungrouped one is bfloat16 (test_amx_convolutions_...)
    on_tiles = {f"w{i}" for i, conv in enumerate(CONVS) if conv[8] == 1} \
        if arithmetic("bf16", "native") == "bf16amx" else set()
    assert set(low_layers(slow.plan)) == on_tiles, "a convolution took vdpbf16ps on a CPU where it runs at half FMA's rate"
    monkeypatch.setattr(toolchain, "_host_features", lambda: real - {precision.SLOW_DOT})
    kept = nncc.compile_model(path, precision="bf16", keep_f32=("w0", "w2"))
    assert sorted(low_layers(kept.plan)) == sorted(f"w{i}" for i in range(len(CONVS)) if i not in (0, 2))


def residual_model(tmp_path) -> str:
    """Conv -> Relu -> Conv + the first's output (a residual Add writes the second): two
    layers whose deviation from float32 in bfloat16 is far over 1e-5."""
    rng = np.random.default_rng(5)
    w0 = (rng.standard_normal((32, 24, 3, 3)) / 15).astype(np.float32)
    w1 = (rng.standard_normal((32, 32, 1, 1)) / 6).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c1", "r0"], ["y"])]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "residual.onnx")
    onnx.save(model, path)
    return path


@pytest.mark.slow
@needs_bf16
def test_auto_keeps_bf16_convolutions_float32_to_meet_the_tolerance(tmp_path, fast_dot):
    from nncc.compiler import OptionError
    from tests.oracle import ort_outputs

    path = residual_model(tmp_path)
    low = nncc.compile_model(path, precision="bf16")
    assert sorted(low_layers(low.plan)) == ["w0", "w1"]
    check = low.plan.options["precision_check"]
    assert check["bfloat16_layers"] == 2 and check["deviation"]["y"] > 1e-5
    with pytest.raises(OptionError, match="over the tolerance"):  # ToleranceExceeded
        nncc.compile_model(path, precision="bf16", tolerance=1e-5)
    auto = nncc.compile_model(path, precision="auto", tolerance=1e-5)
    check = auto.plan.options["precision_check"]
    # the residual convolution is written by its Add: keep_f32 must still reach it
    assert sorted(check["float32_layers"]) == ["w0", "w1"] and not low_layers(auto.plan)
    assert check["deviation"]["y"] <= 1e-5
    x = np.random.default_rng(9).standard_normal((1, 24, 10, 10)).astype(np.float32)
    want = ort_outputs(path, {"x": x})["y"]
    np.testing.assert_allclose(auto.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


needs_amx = pytest.mark.skipif(find_toolchain() is None or arithmetic("bf16", "native") != "bf16amx",
                               reason="no C compiler, or this CPU lacks amx_tile or amx_bf16 (the convolutions "
                                      "then take vdpbf16ps or stay float32, which the tests above check)")

# Convolutions which CPUs with AMX compute on tiles (nncc/native/conv_amx.py): (C, K, H, W,
# kernel, stride, pad, dilation, bias, activation, tiny). 1x1 stride 1 with whole and
# partial 32-channel groups (channel remainders, an odd count of blocks), pixels under one
# tile, between one and two, many micro-tiles and a remainder, an odd count of output
# blocks; 3x3 padded at strides 1 and 2, 1x1 strided, 5x5 dilated, rows under and over 16
# pixels; then the phases a stride splits the input into: a dilation that reads only one
# (3x3, stride 2, dilation 2), a kernel under the stride (2x2, stride 3), and deep weights
# over a few pixels (cut by output channels). tiny: inputs near float32's smallest normal.
AMX_CONVS = [(64, 64, 7, 7, 1, 1, 0, 1, True, "Relu", False), (33, 17, 3, 5, 1, 1, 0, 1, False, "", False),
             (48, 32, 4, 4, 1, 1, 0, 1, True, "", True), (256, 48, 13, 11, 1, 1, 0, 1, True, "Relu", False),
             (96, 80, 1, 33, 1, 1, 0, 1, False, "", True), (64, 48, 14, 20, 3, 1, 1, 1, True, "Relu", False),
             (33, 17, 11, 35, 3, 2, 1, 1, False, "", False), (32, 32, 9, 9, 1, 2, 0, 1, True, "", False),
             (17, 5, 12, 12, 5, 1, 4, 2, False, "Relu", True), (48, 40, 9, 10, 3, 2, 1, 2, True, "", False),
             (40, 24, 10, 11, 2, 3, 0, 1, False, "Relu", False), (256, 96, 4, 4, 3, 1, 1, 1, True, "Relu", False)]


def amx_model(tmp_path):
    rng = np.random.default_rng(11)
    nodes, inits, inputs, outputs, cases = [], [], [], [], {}
    for i, (c, k, h, w, kk, s, p, d, bias, act, tiny) in enumerate(AMX_CONVS):
        x = rng.standard_normal((2, c, h, w)).astype(np.float32) * np.float32(2.0**-124 if tiny else 1)
        wt = (rng.standard_normal((k, c, kk, kk)) / np.sqrt(c * kk * kk)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32) if bias else np.zeros(k, np.float32)
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(x.shape)))
        inits.append(numpy_helper.from_array(wt, f"w{i}"))
        ins = [f"x{i}", f"w{i}"]
        if bias:
            inits.append(numpy_helper.from_array(b, f"b{i}"))
            ins.append(f"b{i}")
        attrs = dict(kernel_shape=[kk, kk], strides=[s, s], pads=[p] * 4, dilations=[d, d], group=1)
        nodes.append(helper.make_node("Conv", ins, [f"y{i}"], **attrs))
        out = f"y{i}"
        if act:
            nodes.append(helper.make_node(act, [out], [f"a{i}"]))
            out = f"a{i}"
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
        cases[out] = (x, wt, b, attrs, act)
    model = helper.make_model(helper.make_graph(nodes, "convs", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "amx_convs.onnx")
    onnx.save(model, path)
    feeds = {f"x{i}": cases[name][0] for i, name in enumerate(cases)}
    return path, cases, feeds


def check_amx_bound(got: dict, cases: dict) -> None:
    """Each output within the bfloat16 bound of the float64 convolution, with the denormal
    term of tdpbf16ps (denormal inputs read as zero, denormal sums flushed)."""
    for name, (x, w, b, attrs, act) in cases.items():
        taps = w.shape[1] * w.shape[2] * w.shape[3]
        terms = conv_terms(x, w, attrs)
        want = activated(conv64(x, w, b, attrs), act)
        xsum = conv_terms(x, np.ones_like(w), attrs)
        wsum = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1).sum(1)[None, :, None, None]
        denormal = 2.0**-126 * ((xsum + wsum) * (1 + 2.0**-8) + taps + 2)
        limit = (2 * 2.0**-8 + 2.0**-16 + (taps + 2) * 2.0**-24) * terms + denormal + 2.0**-22 * np.abs(want)
        err = np.abs(got[name].astype(np.float64) - want)
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}"


@pytest.mark.slow
@needs_amx
def test_amx_convolutions_are_within_the_bound_of_float64(tmp_path):
    path, cases, feeds = amx_model(tmp_path)
    compiled = nncc.compile_model(path, precision="bf16")
    assert sorted(low_layers(compiled.plan)) == sorted(f"w{i}" for i in range(len(AMX_CONVS)))
    got = compiled.run(feeds)
    check_amx_bound(got, cases)
    # a bias swamps a tiny input's sums: only the others tell bfloat16 from float32
    assert not any(np.allclose(got[name], activated(conv64(x, w, b, attrs), act), rtol=2.0**-20, atol=2.0**-140)
                   for name, (x, w, b, attrs, act) in cases.items() if not b.any() or np.abs(x).max() > 2.0**-100), \
        "a convolution was computed in float32"


AMX_OFF_SCRIPT = """
import sys, numpy as np, nncc
feeds = dict(np.load(sys.argv[2]))
np.savez(sys.argv[3], **nncc.compile_model(sys.argv[1], precision="bf16").run(feeds))
"""


@pytest.mark.slow
@needs_amx
def test_amx_off_convolutions_compute_what_vdpbf16ps_computes(tmp_path, monkeypatch):
    """NNCC_AMX=0 (what the runtime also does when Linux refuses the tiles): the step takes
    its vdpbf16ps convolution, the very sums of the code built for a CPU without AMX."""
    path, cases, feeds = amx_model(tmp_path)
    np.savez(tmp_path / "feeds.npz", **feeds)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, NNCC_AMX="0", NNCC_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", AMX_OFF_SCRIPT, path, str(tmp_path / "feeds.npz"),
                           str(tmp_path / "off.npz")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    off = dict(np.load(tmp_path / "off.npz"))
    check_amx_bound(off, cases)
    real = toolchain._host_features()
    monkeypatch.setattr(toolchain, "_host_features", lambda: real - {precision.SLOW_DOT})  # vdpbf16ps alone
    compiled = nncc.compile_model(path, precision="bf16")
    vdp = compiled.run(feeds)
    # the layers that build computes on vdpbf16ps (a 3x3 stride-1 one it takes to Winograd
    # in float32; with tiles refused the AMX code computes it on vdpbf16ps: the bound above)
    direct = {s.name.split("#")[0] for s in compiled.plan.slots if "#" in s.name and s.name.endswith("bf16")}
    compared = [name for name in cases if f"w{name[1:]}" in direct]
    assert len(compared) >= len(cases) - 1, direct
    for name in compared:
        np.testing.assert_array_equal(off[name], vdp[name], err_msg=f"{name}: NNCC_AMX=0 did not take vdpbf16ps")
