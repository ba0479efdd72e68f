"""Optimizer kernels of ai.onnx.preview.training (Momentum, Adagrad, Adam).

onnxruntime's standard build has none of them, so the oracle is the update rule of the
operator's text written out here in float64, and onnx.reference where it agrees with the
text. Several tensors are optimized by one node, with T = 0 (no bias correction, the first
momentum step takes the whole gradient) and T > 0, by both nncc routes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
import pytest

from nncc.errors import NnccError
from tests.one_node_graphs import one_node, run_interpreter, run_nncc

TRAINING = "ai.onnx.preview.training"
rng = np.random.default_rng(3)


def case(n: int, states: int, dtype=np.float32):
    shapes = [(4, 5), (7,), (2, 3, 2)][:n]
    xs = [rng.normal(size=s).astype(dtype) for s in shapes]
    gs = [rng.normal(size=s).astype(dtype) for s in shapes]
    extra = [[np.abs(rng.normal(size=s)).astype(dtype) for s in shapes] for _ in range(states)]
    return xs, gs, extra


def run(op, step, xs, gs, extra, attrs):
    r, t = np.array(0.1, np.float32), np.array(step, np.int64)
    inputs = [r, t, *xs, *gs, *(a for group in extra for a in group)]
    n_out = len(xs) * (1 + len(extra))
    model, feeds, names = one_node(op, inputs, n_out, attrs, {"": 20, TRAINING: 1}, domain=TRAINING)
    return model, feeds, names


def check(model, feeds, names, expected, rtol=1e-5):
    for got in run_nncc(model, feeds, names):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.dtype == np.float32 and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("step", [0, 3])
def test_momentum(mode, step):
    xs, gs, (vs,) = case(3, 1)
    attrs = {"alpha": 0.9, "beta": 0.7, "norm_coefficient": 0.01, "mode": mode}
    model, feeds, names = run("Momentum", step, xs, gs, [vs], attrs)
    new_x, new_v = [], []
    beta = 0.7 if step > 0 else 1.0
    for x, g, v in zip(xs, gs, vs):
        x, g, v = (a.astype(np.float64) for a in (x, g, v))
        g = 0.01 * x + g
        v = 0.9 * v + beta * g
        new_x.append(x - 0.1 * (v if mode == "standard" else g + 0.9 * v))
        new_v.append(v)
    check(model, feeds, names, new_x + new_v)


@pytest.mark.parametrize("step", [0, 5])
def test_adagrad(step):
    xs, gs, (hs,) = case(2, 1)
    attrs = {"decay_factor": 0.1, "epsilon": 1e-6, "norm_coefficient": 0.001}
    model, feeds, names = run("Adagrad", step, xs, gs, [hs], attrs)
    rate = 0.1 / (1 + step * 0.1)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        x, g, h = (a.astype(np.float64) for a in (x, g, h))
        g = 0.001 * x + g
        h = h + g * g
        new_x.append(x - rate * g / (np.sqrt(h) + 1e-6))
        new_h.append(h)
    check(model, feeds, names, new_x + new_h)
    np.testing.assert_allclose(ReferenceEvaluator(model).run(None, feeds)[0], new_x[0], rtol=1e-5)


@pytest.mark.parametrize("step", [0, 4])
def test_adam(step):
    xs, gs, (vs, hs) = case(3, 2)
    attrs = {"alpha": 0.8, "beta": 0.95, "epsilon": 1e-4, "norm_coefficient": 0.01,
             "norm_coefficient_post": 0.02}
    model, feeds, names = run("Adam", step, xs, gs, [vs, hs], attrs)
    rate = 0.1 * np.sqrt(1 - 0.95**step) / (1 - 0.8**step) if step > 0 else 0.1
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        x, g, v, h = (a.astype(np.float64) for a in (x, g, v, h))
        g = 0.01 * x + g
        v = 0.8 * v + 0.2 * g
        h = 0.95 * h + 0.05 * g * g
        new_x.append((1 - 0.02) * (x - rate * v / (np.sqrt(h) + 1e-4)))
        new_v.append(v)
        new_h.append(h)
    check(model, feeds, names, new_x + new_v + new_h, rtol=2e-5)


def test_adam_defaults_match_the_reference():
    xs, gs, (vs, hs) = case(1, 2)
    model, feeds, names = run("Adam", 2, xs, gs, [vs, hs], {})
    expected = ReferenceEvaluator(model).run(None, feeds)
    check(model, feeds, names, [np.asarray(e) for e in expected])


def test_uneven_groups_are_a_clear_error():
    xs, gs, (vs,) = case(2, 1)
    model, feeds, _ = run("Momentum", 1, xs, gs[:1], [vs], {"alpha": 0.9, "beta": 0.1,
                                                             "mode": "standard", "norm_coefficient": 0.0})
    with pytest.raises(NnccError):
        run_interpreter(model, feeds)
