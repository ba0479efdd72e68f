"""The fused attention under ``precision="bf16"`` (nncc/native/attention_bf16_gen.py):
Q·Kᵀ and P·V multiplied in bfloat16 into float32 sums, within the bound docs/native.md
derives against a float64 reference; the same on the vdpbf16ps path (``NNCC_AMX=0``); and
precision auto's way of keeping one float32.

The bound per output element y_i = sum_j w_ij v_j (w the softmax of the scores): Q and K
rounded to 8 significant bits move a score by at most E_ij = scale * ((2^-7 + 2^-16 + (d + 2)
2^-24) sum_d |q_id k_jd| + 2^-126 (sum_d |q_id| + sum_d |k_jd| + d + 2)) (float32 sums and
denormals read as zero included), so each weight by a factor within exp(+-2 E_i), E_i = max_j
E_ij; V and P rounded move each term by at most 2^-7 + 2^-16 of it, and a probability flushed
to zero (below e^-87) by 2^-125 |v_j|. With the float32 softmax (exponentials, sums) a few
ulps on top, |y_i - y_i^exact| <= (expm1(2 E_i) + exp(2 E_i) (2^-7 + 2^-16) + (skv + 8) 2^-22)
* sum_j w_ij |v_j| + skv 2^-125 max |v|.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native.precision import arithmetic, why_not_bf16
from nncc.native.toolchain import find_toolchain
from nncc.preparing.calibration import low_layers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_COMPILER = find_toolchain() is None
needs_bf16 = pytest.mark.skipif(NO_COMPILER or why_not_bf16("native") is not None,
                                reason="no C compiler, or this CPU lacks avx512_bf16 (a bf16 compile then keeps "
                                       "the attention float32)")
needs_amx = pytest.mark.skipif(NO_COMPILER or arithmetic("bf16", "native") != "bf16amx",
                               reason="no C compiler, or this CPU lacks amx_tile or amx_bf16 (no tiles to turn off)")

# (batch, heads, query rows, keys, head size of Q and K, of V, causal mask): a query block
# of at most 16 rows (one row of tiles) and of more, a tail key block of at most and more
# than 32 keys, odd head sizes (a pair padded), V's width below, at and past the tiles' 16
# and 32 columns, a causal mask whose hidden key blocks are skipped
GEOMETRIES = [(1, 2, 40, 70, 64, 64, False), (2, 3, 33, 65, 17, 33, False), (1, 2, 128, 128, 64, 64, True),
              (1, 1, 200, 130, 80, 16, False), (1, 1, 16, 64, 32, 48, True), (1, 4, 9, 1, 3, 5, False)]


def attention_model(path, seed: int = 0):
    """Every geometry side by side in one model, saved: (feeds, output -> its geometry)."""
    rng = np.random.default_rng(seed)
    nodes, inputs, outputs, inits, feeds, cases = [], [], [], [], {}, {}
    for i, (b, h, sq, skv, d, dv, causal) in enumerate(GEOMETRIES):
        for name, shape in ((f"q{i}", (b, h, sq, d)), (f"k{i}", (b, h, d, skv)), (f"v{i}", (b, h, skv, dv))):
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), f"c{i}"))
        nodes += [helper.make_node("MatMul", [f"q{i}", f"k{i}"], [f"s{i}"]),
                  helper.make_node("Mul", [f"s{i}", f"c{i}"], [f"t{i}"])]
        scores = f"t{i}"
        mask = np.zeros((sq, skv), np.float32)
        if causal:
            mask = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq), -1e9, 0).astype(np.float32)
            inits.append(numpy_helper.from_array(mask, f"m{i}"))
            nodes.append(helper.make_node("Add", [scores, f"m{i}"], [f"u{i}"]))
            scores = f"u{i}"
        nodes += [helper.make_node("Softmax", [scores], [f"p{i}"], axis=-1),
                  helper.make_node("MatMul", [f"p{i}", f"v{i}"], [f"y{i}"])]
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
        cases[f"y{i}"] = (f"q{i}", f"k{i}", f"v{i}", 1 / np.sqrt(d), mask)
    model = helper.make_model(helper.make_graph(nodes, "attention", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return feeds, cases


def exact_and_bound(q, k, v, scale, mask):
    """The float64 attention and the module docstring's bound, per output element."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    d, skv = q.shape[-1], v.shape[-2]
    s = scale * (q @ k) + mask
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    qa, ka = np.abs(q), np.abs(k)
    e = scale * ((2.0**-7 + 2.0**-16 + (d + 2) * 2.0**-24) * (qa @ ka)
                 + 2.0**-126 * (qa.sum(-1, keepdims=True) + ka.sum(-2, keepdims=True) + d + 2))
    e = e.max(-1, keepdims=True)
    weighted = w @ np.abs(v)
    bound = (np.expm1(2 * e) + np.exp(2 * e) * (2.0**-7 + 2.0**-16) + (skv + 8) * 2.0**-22) * weighted
    return w @ v, bound + skv * 2.0**-125 * np.abs(v).max()


def check_within_bound(got: dict, feeds: dict, cases: dict) -> int:
    """Asserts every output within its bound; how many are equal to float64's within
    float32 rounding alone (which bfloat16 products cannot all be)."""
    close = 0
    for name, (q, k, v, scale, mask) in cases.items():
        want, bound = exact_and_bound(feeds[q], feeds[k], feeds[v], scale, mask)
        err = np.abs(got[name].astype(np.float64) - want)
        assert (err <= bound).all(), f"{name}: off by {err.max():.3g}, bound {bound[err > bound].min():.3g}"
        close += int((err <= 2.0**-18 * np.abs(feeds[v]).max()).all())
    return close


@needs_bf16
@pytest.mark.slow  # compiles six attentions
def test_bf16_attention_is_within_the_bound_of_float64(tmp_path):
    feeds, cases = attention_model(tmp_path / "a.onnx")
    compiled = nncc.compile_model(str(tmp_path / "a.onnx"), precision="bf16")
    assert compiled.native_partitions == len(compiled.plan.partitions), "a partition stayed portable"
    assert sorted(compiled.plan.options.get("bf16_attention", [])) == sorted(cases), \
        "not every attention was fused and computed in bfloat16"
    close = check_within_bound(compiled.run(feeds), feeds, cases)
    # float32 products pass the bound too: they must not pass for bfloat16's
    assert close <= 1, "the attentions were not computed in bfloat16"


@needs_amx
@pytest.mark.slow  # a second process compiles the model again
def test_amx_off_takes_vdpbf16ps_within_the_same_bound(tmp_path):
    """NNCC_AMX=0 (as when Linux refuses the tiles): the same code runs its vdpbf16ps
    products, whose sums differ from the tiles' in order only."""
    feeds, cases = attention_model(tmp_path / "a.onnx")
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = ("import sys, numpy as np, nncc; f = dict(np.load(sys.argv[1])); "
              "m = nncc.compile_model(sys.argv[2], precision='bf16'); np.savez(sys.argv[3], **m.run(f))")
    env = dict(os.environ, PYTHONPATH=ROOT, NNCC_AMX="0", NNCC_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "feeds.npz"), str(tmp_path / "a.onnx"),
                    str(tmp_path / "out.npz")], check=True, env=env, cwd=ROOT)
    off = dict(np.load(tmp_path / "out.npz"))
    check_within_bound(off, feeds, cases)
    tiles = nncc.compile_model(str(tmp_path / "a.onnx"), precision="bf16").run(feeds)
    assert any(not np.array_equal(off[name], tiles[name]) for name in cases), "NNCC_AMX=0 did not change the path"


@needs_bf16
@pytest.mark.slow  # three compiles
def test_an_attention_kept_float32_computes_what_float32_does(tmp_path):
    """precision auto keeps layers float32 by name (CompileOptions.keep_f32): an attention
    is named by its output, listed among the plan's bfloat16 layers until kept, and then
    computes exactly what the float32 compile does."""
    feeds, cases = attention_model(tmp_path / "a.onnx")
    path = str(tmp_path / "a.onnx")
    low = nncc.compile_model(path, precision="bf16")
    assert set(cases) <= set(low_layers(low.plan))
    kept_name = "y2"
    f32 = nncc.compile_model(path).run(feeds)
    kept = nncc.compile_model(path, precision="bf16", keep_f32=(kept_name,))
    assert kept_name not in kept.plan.options.get("bf16_attention", [])
    assert kept_name not in low_layers(kept.plan)
    got = kept.run(feeds)
    np.testing.assert_array_equal(got[kept_name], f32[kept_name])
    assert not np.array_equal(got["y0"], f32["y0"]), "the attention not kept was float32 too"
