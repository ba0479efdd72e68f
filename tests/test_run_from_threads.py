"""One prepared model run from several Python threads at once: a BERT-like encoder layer
(its attention one fused native kernel) and a convnet, each prepared once with a native
pool of two threads, then run by four Python threads together, each thread with inputs of
its own. Every result must be onnxruntime's for that thread's own input, both when it is
returned and after every thread has finished (a result array that a later run, or another
thread's, wrote into would change under its owner), and a caller's own output arrays must
hold that caller's results. Then the convnet with its batch dimension open, the callers'
batch sizes differing, so the shape plans are made and used while other threads run.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import onnx
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from nncc.util.threads import blas_threads, limit_blas_threads
from tests.models import GraphBuilder, convnet
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

CALLERS = 4
RUNS = 12  # per caller and model


def _encoder_layer(batch=2, seq=40, hidden=64, heads=4) -> GraphBuilder:
    """Self-attention (projections, heads split by Reshape and Transpose, a padding mask fed
    at run time, Softmax, heads merged), a residual and LayerNormalization, then a GELU
    feed-forward block with its residual and LayerNormalization, as BERT's exporters write it."""
    m = GraphBuilder(17, 4, "encoder", weight_gain=1.0)
    x = m.input([batch, seq, hidden])
    mask = m.input([batch, 1, 1, seq])
    size = hidden // heads

    def heads_of(y, perm):
        return m.node("Transpose", [m.node("Reshape", [y, m.ints([batch, seq, heads, size])])], perm=perm)

    def dense(y, n_in, n_out):
        return m.node("Add", [m.node("MatMul", [y, m.weight([n_in, n_out])]), m.const(np.zeros(n_out) + 0.01)])

    def norm(y):
        return m.node("LayerNormalization", [y, m.const(np.ones(hidden)), m.const(np.zeros(hidden))], axis=-1)

    q = heads_of(dense(x, hidden, hidden), [0, 2, 1, 3])
    k = heads_of(dense(x, hidden, hidden), [0, 2, 3, 1])
    v = heads_of(dense(x, hidden, hidden), [0, 2, 1, 3])
    scores = m.node("Mul", [m.node("MatMul", [q, k]), m.const(1.0 / math.sqrt(size))])
    probs = m.node("Softmax", [m.node("Add", [scores, mask])], axis=-1)
    context = m.node("Transpose", [m.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    context = m.node("Reshape", [context, m.ints([batch, seq, hidden])])
    y = norm(m.node("Add", [dense(context, hidden, hidden), x]))
    h = dense(y, hidden, 4 * hidden)
    gelu = m.node("Mul", [m.node("Mul", [h, m.const(0.5)]),
                          m.node("Add", [m.node("Erf", [m.node("Div", [h, m.const(math.sqrt(2.0))])]),
                                         m.const(1.0)])])
    m.output(norm(m.node("Add", [dense(gelu, 4 * hidden, hidden), y])))
    return m


def _encoder_feeds(builder: GraphBuilder, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    (batch, seq, hidden), mask_shape = builder.feeds["x0"].shape, builder.feeds["x1"].shape
    lengths = rng.integers(1, seq + 1, size=(batch, 1))
    mask = np.where(np.arange(seq)[None, :] < lengths, 0.0, -10000.0).reshape(mask_shape)
    return {"x0": rng.standard_normal((batch, seq, hidden)).astype(np.float32), "x1": mask.astype(np.float32)}


def _run_together(jobs) -> list:
    """Each job (a function of no arguments) in a thread of its own, started together;
    their results, or the first exception one raised."""
    start = threading.Barrier(len(jobs))
    results: list = [None] * len(jobs)
    errors: list = []

    def work(i, job):
        start.wait()
        try:
            results[i] = job()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.slow
def test_one_prepared_model_runs_from_four_threads_at_once(tmp_path):
    if blas_threads() is None:
        pytest.skip("numpy's BLAS here has no known thread-count entry point: the pool's size cannot be set")
    encoder = _encoder_layer()
    encoder_path = tmp_path / "encoder.onnx"
    encoder.save(encoder_path)
    conv_path = tmp_path / "convnet.onnx"
    onnx.save(convnet(seed=6), str(conv_path))
    with limit_blas_threads(2):
        bert = nncc.compile_model(encoder_path)
        conv = nncc.compile_model(conv_path, dims={"n": 3})
    for model in (bert, conv):
        assert model.native_partitions == 1 and len(model.plan.partitions) == 1, model.plan.fallbacks
        assert model._executor.loaded["native"].threads == 2
    assert "nncc::FusedAttention::1" in bert.plan.kernels
    (bert_out,), (conv_out,) = bert.output_names, conv.output_names

    feeds, wants = {}, {}  # per (caller, run): the inputs and onnxruntime's outputs for them
    for caller in range(CALLERS):
        for run in range(RUNS):
            seed = 1000 * caller + run
            bert_feeds = _encoder_feeds(encoder, seed)
            conv_feeds = {"x": np.random.default_rng(seed).standard_normal((3, 3, 16, 16)).astype(np.float32)}
            feeds[caller, run] = (bert_feeds, conv_feeds)
            wants[caller, run] = (ort_run(encoder_path, bert_feeds, [bert_out])[0],
                                  ort_run(conv_path, conv_feeds, [conv_out])[0])

    def check(caller, run, got_bert, got_conv):
        want_bert, want_conv = wants[caller, run]
        np.testing.assert_allclose(got_bert, want_bert, rtol=1e-4, atol=1e-4, err_msg=f"encoder, caller {caller}")
        np.testing.assert_allclose(got_conv, want_conv, rtol=1e-4, atol=1e-4, err_msg=f"convnet, caller {caller}")

    def caller_job(caller):
        def job():
            kept = []
            own = {bert_out: np.empty_like(wants[caller, 0][0])}  # the odd runs write into the caller's array
            for run in range(RUNS):
                bert_feeds, conv_feeds = feeds[caller, run]
                got_bert = bert.run(bert_feeds, outputs=own if run % 2 else None)[bert_out]
                if run % 2:
                    assert got_bert is own[bert_out] or np.shares_memory(got_bert, own[bert_out])
                    got_bert = got_bert.copy()  # the caller's array is written again by its next odd run
                got_conv = conv.run(conv_feeds)[conv_out]
                check(caller, run, got_bert, got_conv)
                kept.append((run, got_bert, got_conv))
            return kept
        return job

    for caller, kept in enumerate(_run_together([caller_job(c) for c in range(CALLERS)])):
        for run, got_bert, got_conv in kept:  # unchanged since it was returned
            check(caller, run, got_bert, got_conv)


def test_a_dynamic_batch_runs_from_four_threads_at_once_with_different_sizes(tmp_path):
    """The convnet with its batch dimension left open: the callers' batch sizes differ and
    change from run to run, so the runs go through the shape plans (a sample loop over the
    plan for one sample, plans of their own for sizes that recur) while other threads run."""
    path = tmp_path / "convnet.onnx"
    onnx.save(convnet(seed=6), str(path))
    with limit_blas_threads(2):
        model = nncc.compile_model(path)
    wants = {}
    for caller in range(CALLERS):
        for run in range(RUNS):
            x = np.random.default_rng(100 * caller + run).standard_normal((1 + (caller + run) % 4, 3, 16, 16))
            wants[caller, run] = (x.astype(np.float32), ort_run(path, {"x": x.astype(np.float32)}, ["y"])[0])

    def caller_job(caller):
        def job():
            kept = []
            for run in range(RUNS):
                x, want = wants[caller, run]
                got = model.run({"x": x})["y"]
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"caller {caller}, run {run}")
                kept.append((got, want))
            return kept
        return job

    for caller, kept in enumerate(_run_together([caller_job(c) for c in range(CALLERS)])):
        for run, (got, want) in enumerate(kept):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"caller {caller}, run {run}")
    assert model.shape_plans  # the sizes that recurred got plans of their own
