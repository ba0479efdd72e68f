"""Fused kernels in the private "nncc" domain, produced by fusion passes (nncc.passes.fusion).

* ``FusedConv(X, W, [B])``: the ONNX Conv, then an activation applied in place.
* ``FusedGemm(A, B, [C])``: the ONNX Gemm, then an activation applied in place.
* ``FusedMatMul(A, B, [bias])``: ``np.matmul(A, B)``, then ``+= bias`` (broadcast over the
  last axis) and an activation, both in place. Unlike Gemm, A may have any rank.

Attributes: those of the underlying ONNX op, plus

* ``activation`` (str, optional): Relu, LeakyRelu, Clip, Sigmoid, Tanh, HardSigmoid,
  HardSwish, Silu (x * sigmoid(x)), Mish or Gelu (``activation_approximate``: "none", the erf form, or "tanh"); absent
  or "" for none;
* its parameters as floats: ``activation_alpha`` (LeakyRelu, HardSigmoid),
  ``activation_beta`` (HardSigmoid), ``activation_min`` / ``activation_max`` (Clip; absent
  means unbounded). They are prefixed because Gemm has alpha and beta attributes of its own;
* ``onnx_opset`` (int): the default-domain opset of the model the node came from, so the
  underlying ONNX kernel is resolved exactly as the unfused node's was.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.kernels.bounds import bound
from nncc.kernels.linalg import BLAS_DTYPES, matmul_route
from nncc.kernels.registry import Ctx, kernel, resolve, stand_ins
from nncc.kernels.shapes import check_size

ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Silu", "Mish", "Gelu")
_NNCC_ACTIVATIONS = ("Silu", "Mish")  # nncc ops of their own (nncc.kernels.activation), at any opset
DEFAULT_ONNX_OPSET = 22


@functools.lru_cache(maxsize=None)
def _onnx(op_type: str, opset: int):
    return resolve(op_type, "", opset)


def _inner_ctx(ctx) -> Ctx:
    """The context the underlying ONNX kernel sees, made once per node: it shares the
    node's scratch buffers, so they survive between runs."""
    inner = ctx.scratch.get("inner ctx")
    if inner is None:
        opset = int(ctx.get("onnx_opset", DEFAULT_ONNX_OPSET))
        inner = ctx.scratch["inner ctx"] = Ctx(ctx.attrs, opset, 1, ctx.name)
        inner.scratch = ctx.scratch
    inner.workspace = ctx.workspace  # the executor may have replaced it after creation
    inner.constant_inputs = ctx.constant_inputs
    return inner


def _fresh(y: np.ndarray, inputs) -> np.ndarray:
    """``y`` if it is safe to overwrite (its own writable memory), else a copy."""
    if not isinstance(y, np.ndarray) or not y.flags.writeable or any(
            a is not None and np.may_share_memory(y, a) for a in inputs):
        return np.array(y)
    return y


def apply_activation(ctx, y: np.ndarray) -> np.ndarray:
    """Apply the node's activation to ``y`` (which the caller owns), in place when possible."""
    name = ctx.get("activation") or ""
    if not name:
        return y
    if name not in ACTIVATIONS:
        raise KernelError(f"{ctx.name or 'fused node'}: unknown fused activation {name!r}")
    if y.dtype not in (np.float32, np.float64) or name == "Gelu":
        return _delegate(ctx, name, y)  # float16 etc.: the ONNX kernel's exact rounding
    t = y.dtype.type
    contiguous = y.flags.c_contiguous
    if name == "Relu":
        if contiguous:
            bound(y, np.maximum, 0.0)
        else:
            np.maximum(y, t(0), out=y)
    elif name == "Clip" and contiguous:
        lo, hi = ctx.get("activation_min"), ctx.get("activation_max")
        if lo is not None:
            bound(y, np.maximum, float(t(lo)))
        if hi is not None:
            bound(y, np.minimum, float(t(hi)))
    elif name == "LeakyRelu":
        alpha = t(ctx.get("activation_alpha", 0.01))
        np.multiply(y, alpha, out=y, where=y < 0)
    elif name == "Clip":
        lo, hi = ctx.get("activation_min"), ctx.get("activation_max")
        if lo is not None:
            np.maximum(y, t(lo), out=y)
        if hi is not None:
            np.minimum(y, t(hi), out=y)
    elif name == "Sigmoid":
        np.negative(y, out=y)
        with np.errstate(over="ignore"):
            np.exp(y, out=y)
        y += t(1)
        np.reciprocal(y, out=y)
    elif name == "Tanh":
        np.tanh(y, out=y)
    elif name == "HardSigmoid":
        y *= t(ctx.get("activation_alpha", 0.2))
        y += t(ctx.get("activation_beta", 0.5))
        np.maximum(y, t(0), out=y)
        np.minimum(y, t(1), out=y)
    elif name == "HardSwish":
        gate = np.multiply(y, t(1.0 / 6.0))
        gate += t(0.5)
        np.maximum(gate, t(0), out=gate)
        np.minimum(gate, t(1), out=gate)
        y *= gate
    elif name == "Silu":
        gate = np.negative(y)
        with np.errstate(over="ignore"):
            np.exp(gate, out=gate)
        gate += t(1)
        np.divide(y, gate, out=y)
    elif name == "Mish":
        gate = np.logaddexp(t(0), y)  # softplus, without overflow
        np.tanh(gate, out=gate)
        y *= gate
    return y


def _delegate(ctx, name: str, y: np.ndarray) -> np.ndarray:
    if name in _NNCC_ACTIVATIONS:
        return resolve(name, "nncc", 1).fn(Ctx({}, 1, 1, ctx.name), y)
    attrs: dict = {}
    opset = 14
    if name in ("LeakyRelu", "HardSigmoid") and ctx.get("activation_alpha") is not None:
        attrs["alpha"] = ctx.get("activation_alpha")
    if name == "HardSigmoid" and ctx.get("activation_beta") is not None:
        attrs["beta"] = ctx.get("activation_beta")
    if name == "Gelu":
        opset = 20
        attrs["approximate"] = ctx.get("activation_approximate", "none")
    if name == "Clip":
        opset = 6  # min/max as attributes
        for key in ("min", "max"):
            if ctx.get(f"activation_{key}") is not None:
                attrs[key] = ctx.get(f"activation_{key}")
    return _onnx(name, opset).fn(Ctx(attrs, opset, 1, ctx.name), y)


# --------------------------------------------------------------------------- FusedConv, FusedGemm


def _fused_onnx(op_type: str):
    """FusedConv / FusedGemm: the ONNX op's kernel (into ``out`` when given), then the
    activation in place on a result this node owns."""

    def shape(ctx, *infos):
        inner = _inner_ctx(ctx)
        return _onnx(op_type, inner.opset).shape(inner, *infos)

    def run(ctx, *args, out=None):
        inner = _inner_ctx(ctx)
        y = _onnx(op_type, inner.opset).fn(inner, *args, out=out)
        if out is None or y is not out[0]:
            y = _fresh(y, args)
        return apply_activation(ctx, y)

    def prepare(ctx, *infos):
        """The ONNX kernel's first phase, when it has one, then the activation."""
        inner = _inner_ctx(ctx)
        first = _onnx(op_type, inner.opset).prepare
        run_inner = None if first is None else first(inner, *infos)
        if run_inner is None:
            return None

        def run_prepared(ctx, *args, out=None):
            y = run_inner(inner, *args, out=out)
            if out is None or y is not out[0]:
                y = _fresh(y, args)
            return apply_activation(ctx, y)

        return run_prepared

    run.__name__ = f"fused_{op_type.lower()}"
    run.arity = (2, 3)  # (required, most) inputs, as the wrapped Conv and Gemm take (KernelDef.arity)
    kernel(f"Fused{op_type}", since=1, domain="nncc", shape=shape, writes_out=True, prepare=prepare)(run)
    return run


fused_conv = _fused_onnx("Conv")
fused_gemm = _fused_onnx("Gemm")


# --------------------------------------------------------------------------- FusedMatMul


def _fused_matmul_shape(ctx, a, b, bias=None):
    inner = _inner_ctx(ctx)
    product = _onnx("MatMul", inner.opset).shape(inner, a, b)
    if bias is not None and bias.shape is not None:  # as the kernel adds it: one value, or one per column
        if len(bias.shape) > 1:
            raise ShapeInferenceError(f"FusedMatMul: bias must have rank <= 1, got shape {tuple(bias.shape)}")
        y = product[0].shape
        check_size("FusedMatMul", "bias", bias, 1, None if y is None else y[-1] if y else 1)
    return product


def _fused_matmul_prepare(ctx, a, b, bias=None):
    """FusedMatMul's first phase, for matrices (rank >= 2) of one BLAS dtype: operands and
    bias checked once, so a run is the product, the bias and the activation alone."""
    like = stand_ins(a, b, bias)
    if like is None or a.dtype not in BLAS_DTYPES or b.dtype != a.dtype or len(a.shape) < 2 or len(b.shape) < 2 \
            or (bias is not None and bias.dtype != a.dtype):
        return None
    matmul_route(like[0], like[1])  # a KernelError for operands that do not multiply
    if bias is not None and (len(bias.shape) > 1 or math.prod(bias.shape) not in (1, b.shape[-1])):
        return None  # the kernel reports it when it runs
    dtype = a.dtype

    def fused_matmul_prepared(ctx, a, b, bias=None, out=None):
        y = np.matmul(a, b, out=out[0] if out is not None and out[0].dtype == dtype else None)
        if bias is not None:
            np.add(y, bias, out=y)
        return apply_activation(ctx, y)

    return fused_matmul_prepared


@kernel("FusedMatMul", since=1, domain="nncc", shape=_fused_matmul_shape, writes_out=True,
        prepare=_fused_matmul_prepare)
def fused_matmul(ctx, a, b, bias=None, out=None):
    target = out[0] if out is not None and out[0].dtype == a.dtype else None
    try:
        y = np.matmul(a, b, out=target)
    except ValueError as exc:
        raise KernelError(f"FusedMatMul: cannot multiply {a.shape} by {b.shape}: {exc}") from None
    if not isinstance(y, np.ndarray):  # 1-D @ 1-D gives a numpy scalar
        y = np.array(y)
    # np.matmul's result is its own memory: no overlap check needed
    if bias is not None:
        if bias.ndim > 1 or (bias.size not in (1, y.shape[-1] if y.ndim else 1)):
            raise KernelError(f"FusedMatMul: bias of shape {bias.shape} does not match the "
                              f"last axis of the product {y.shape}")
        np.add(y, bias, out=y, casting="same_kind")
    return apply_activation(ctx, y)
