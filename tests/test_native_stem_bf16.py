"""A network's first convolution (few channels of the plain NCHW input) in bfloat16 on AMX
tiles (``precision="bf16"``, nncc/native/conv_stem_bf16.py): within the bound bfloat16
rounding gives against a float64 convolution, reported as a bfloat16 layer, kept float32
where precision auto keeps it, and the float32 stem's own sums where the tiles are refused
(NNCC_AMX=0).

The bound, per output, is conv_amx's (tests/test_native_bf16_conv.check_amx_bound): both
inputs rounded to 8 significant bits, float32 sums of the T taps, a bias and a rounding,
``(2 * 2^-8 + 2^-16 + (T + 2) * 2^-24) * sum |x * w|``, plus the denormal term of tdpbf16ps.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nncc
from nncc.native.precision import arithmetic
from nncc.native.toolchain import find_toolchain
from nncc.preparing.calibration import low_layers
from tests.native_fuzz_cases import conv_terms
from tests.test_native_bf16_conv import activated, conv64

needs_amx = pytest.mark.skipif(find_toolchain() is None or arithmetic("bf16", "native") != "bf16amx",
                               reason="no C compiler, or this CPU lacks amx_tile or amx_bf16 (the stem then stays "
                                      "float32)")

# (C, K, H, W, kernel, stride, pad, bias, activation, tiny): ResNet's 7x7 stride 2 over RGB
# (a receptive field of 147, five tiles), MobileNet's 3x3 stride 2 (27, one tile), one and
# four channels, output channels that are not whole blocks or micro-tiles, pixels that
# leave a partial tile, a row dilation, asymmetric pads; tiny: inputs near float32's
# smallest normal (some denormal: the tiles read them as zero).
STEMS = [(3, 64, 30, 34, 7, 2, 3, True, "Relu", False), (3, 32, 17, 19, 3, 2, 1, True, "Clip", False),
         (1, 24, 9, 40, 5, 1, 2, False, "", False), (4, 17, 11, 13, 3, 1, 0, True, "Sigmoid", True),
         (3, 48, 8, 8, 7, 2, 3, False, "Relu", False)]


def stem_model(tmp_path, dilation_last: bool = True):
    rng = np.random.default_rng(17)
    nodes, inits, inputs, outputs, cases = [], [], [], [], {}
    for i, (c, k, h, w, kk, s, p, bias, act, tiny) in enumerate(STEMS):
        x = rng.standard_normal((2, c, h, w)).astype(np.float32) * np.float32(2.0**-124 if tiny else 1)
        wt = (rng.standard_normal((k, c, kk, kk)) / np.sqrt(c * kk * kk)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32) if bias else np.zeros(k, np.float32)
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(x.shape)))
        inits.append(numpy_helper.from_array(wt, f"w{i}"))
        ins = [f"x{i}", f"w{i}"]
        if bias:
            inits.append(numpy_helper.from_array(b, f"b{i}"))
            ins.append(f"b{i}")
        pads = [p, p + 1, p, p] if i == 1 else [p] * 4
        dil = [2, 1] if i == len(STEMS) - 1 and dilation_last else [1, 1]
        attrs = dict(kernel_shape=[kk, kk], strides=[s, s], pads=pads, dilations=dil, group=1)
        nodes.append(helper.make_node("Conv", ins, [f"y{i}"], **attrs))
        out = f"y{i}"
        if act == "Clip":
            nodes.append(helper.make_node("Clip", [out, "lo", "hi"], [f"a{i}"]))
        elif act:
            nodes.append(helper.make_node(act, [out], [f"a{i}"]))
        if act:
            out = f"a{i}"
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
        cases[out] = (x, wt, b, attrs, act)
    inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
              numpy_helper.from_array(np.array(0.75, np.float32), "hi")]
    model = helper.make_model(helper.make_graph(nodes, "stems", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = str(tmp_path / "stems.onnx")
    onnx.save(model, path)
    feeds = {f"x{i}": cases[name][0] for i, name in enumerate(cases)}
    return path, cases, feeds


def finished(y: np.ndarray, act: str) -> np.ndarray:
    if act == "Clip":
        return np.clip(y, -0.5, 0.75)
    if act == "Sigmoid":
        return 1 / (1 + np.exp(-y))
    return activated(y, act)


def check_bound(got: dict, cases: dict) -> None:
    """Each output within the bfloat16 bound of the float64 convolution, activated: Relu and
    Clip are 1-Lipschitz, Sigmoid 1/4, so the sums' bound passes through them; the
    activation's own float32 evaluation adds a few units of float32 rounding."""
    for name, (x, w, b, attrs, act) in cases.items():
        taps = w.shape[1] * w.shape[2] * w.shape[3]
        terms = conv_terms(x, w, attrs)
        want = finished(conv64(x, w, b, attrs), act)
        xsum = conv_terms(x, np.ones_like(w), attrs)
        wsum = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1).sum(1)[None, :, None, None]
        denormal = 2.0**-126 * ((xsum + wsum) * (1 + 2.0**-8) + taps + 2)
        limit = (2 * 2.0**-8 + 2.0**-16 + (taps + 2) * 2.0**-24) * terms + denormal + 2.0**-20 * np.abs(want) \
            + (2.0**-23 if act == "Sigmoid" else 0.0)
        err = np.abs(got[name].astype(np.float64) - want)
        assert (err <= limit).all(), f"{name}: off by {err.max():.3g}"


@pytest.mark.slow
@needs_amx
def test_stems_on_tiles_are_within_the_bound_of_float64(tmp_path):
    path, cases, feeds = stem_model(tmp_path)
    compiled = nncc.compile_model(path, precision="bf16")
    stems = sorted(s.name for s in compiled.plan.slots if "#stem" in s.name)
    assert stems == sorted(f"w{i}#stem16bf16" for i in range(len(STEMS))), stems
    assert sorted(low_layers(compiled.plan)) == sorted(f"w{i}" for i in range(len(STEMS)))
    got = compiled.run(feeds)
    check_bound(got, cases)
    assert not any(np.allclose(got[name], finished(conv64(x, w, b, attrs), act), rtol=2.0**-20, atol=2.0**-140)
                   for name, (x, w, b, attrs, act) in cases.items() if np.abs(x).max() > 2.0**-100), \
        "a stem was computed in float32"


@pytest.mark.slow
@needs_amx
def test_stems_stay_float32_under_precision_f32_and_where_kept(tmp_path):
    path, cases, feeds = stem_model(tmp_path)
    f32 = nncc.compile_model(path)
    assert not any("#stem" in s.name for s in f32.plan.slots) and not low_layers(f32.plan)
    kept = nncc.compile_model(path, precision="bf16", keep_f32=("w0", "w2"))
    assert sorted(low_layers(kept.plan)) == sorted(f"w{i}" for i in range(len(STEMS)) if i not in (0, 2))
    got, want = kept.run(feeds), f32.run(feeds)
    for i, name in enumerate(cases):
        if i in (0, 2):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} kept float32 is not the f32 stem")


AMX_OFF_SCRIPT = """
import sys, numpy as np, nncc
feeds = dict(np.load(sys.argv[2]))
np.savez(sys.argv[3], **nncc.compile_model(sys.argv[1], precision=sys.argv[4]).run(feeds))
"""


@pytest.mark.slow
@needs_amx
def test_amx_off_stems_compute_the_float32_stem(tmp_path):
    """NNCC_AMX=0 (what the runtime also does when Linux refuses the tiles): the step takes
    its float32 stem, the very outputs precision f32 computes."""
    path, cases, feeds = stem_model(tmp_path)
    np.savez(tmp_path / "feeds.npz", **feeds)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, NNCC_AMX="0", NNCC_CACHE_DIR=str(tmp_path / "cache"))
    runs = {}
    for precision in ("bf16", "f32"):
        done = subprocess.run([sys.executable, "-c", AMX_OFF_SCRIPT, path, str(tmp_path / "feeds.npz"),
                               str(tmp_path / f"{precision}.npz"), precision], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        runs[precision] = dict(np.load(tmp_path / f"{precision}.npz"))
    for name in cases:
        np.testing.assert_array_equal(runs["bf16"][name], runs["f32"][name], err_msg=f"{name}: NNCC_AMX=0")
