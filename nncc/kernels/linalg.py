"""Linear algebra kernels: MatMul, Gemm, Einsum, Det.

float16 products are computed in float32 (numpy has no float16 BLAS; this is also what
ONNX Runtime's accumulation does) and cast back.

MatMul and Gemm validate their operands and parse attributes once per node and input
shapes/dtypes (a plan in ``ctx.scratch``); the hot path of float32/float64 operands is then
one np.dot / np.matmul call (np.dot has the lower fixed cost for 2-D operands) plus alpha
and C.
"""

from __future__ import annotations

import re

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel, stand_ins
from nncc.kernels.shapes import broadcast


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    # float16 and bfloat16 (ml_dtypes) are accumulated in float32
    return np.dtype(np.float32) if dtype == np.float16 or dtype.name == "bfloat16" else dtype


def _dims_match(a, b) -> bool:
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


# --------------------------------------------------------------------------- MatMul


def matmul_shape(ctx, a, b):
    if a.shape is None or b.shape is None:
        return [TensorInfo(a.dtype, None)]
    sa, sb = tuple(a.shape), tuple(b.shape)
    if len(sa) == 0 or len(sb) == 0:
        raise ShapeInferenceError("MatMul: inputs must have rank >= 1")
    a_vec, b_vec = len(sa) == 1, len(sb) == 1
    if a_vec:
        sa = (1,) + sa
    if b_vec:
        sb = sb + (1,)
    if not _dims_match(sa[-1], sb[-2]):
        raise ShapeInferenceError(f"MatMul: inner dimensions differ: {a.shape} x {b.shape}")
    batch = broadcast(sa[:-2], sb[:-2])
    out = tuple(batch) + ((sa[-2],) if not a_vec else ()) + ((sb[-1],) if not b_vec else ())
    return [TensorInfo(a.dtype, out)]


def _matmul(a, b, out=None):
    if a.ndim == 0 or b.ndim == 0:
        raise KernelError("MatMul: inputs must have rank >= 1")
    if a.dtype != b.dtype:
        raise KernelError(f"MatMul: input dtypes differ ({a.dtype} vs {b.dtype})")
    cdt = _compute_dtype(a.dtype)
    if cdt != a.dtype:
        a = a.astype(cdt)
        b = b.astype(cdt)
        out = None
    try:
        y = np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    except ValueError as e:
        raise KernelError(f"MatMul: incompatible shapes {a.shape} x {b.shape}") from e
    return y


def _matmul_prepare(ctx, a, b):
    """MatMul's first phase: the route for these static operands, chosen once."""
    like = stand_ins(a, b)
    if like is None:
        return None
    route, dtype = matmul_route(*like), a.dtype
    if route == _DOT:
        def matmul_dot(ctx, a, b, out=None):
            if out is not None and out[0].flags.c_contiguous and out[0].dtype == dtype:
                return np.dot(a, b, out=out[0])
            return np.dot(a, b)

        return matmul_dot
    if route == _MATMUL:
        def matmul_batched(ctx, a, b, out=None):
            return np.matmul(a, b) if out is None else np.matmul(a, b, out=out[0])

        return matmul_batched
    return None


@kernel("MatMul", since=1, shape=matmul_shape, writes_out=True, prepare=_matmul_prepare)
def matmul(ctx, a, b, out=None):
    # Hot path: operands already validated for these shapes/dtypes by an earlier call.
    key = (a.shape, b.shape, a.dtype, b.dtype)
    plan = ctx.scratch.get("matmul plan")
    if plan is None or plan[0] != key:
        plan = ctx.scratch["matmul plan"] = (key, matmul_route(a, b))
    route = plan[1]
    if route == _DOT:  # both operands of rank <= 2 in a BLAS dtype: np.dot is the cheapest call
        if out is not None and out[0].flags.c_contiguous and out[0].dtype == a.dtype:
            return np.dot(a, b, out=out[0])
        return np.dot(a, b)
    if route == _MATMUL:
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out[0])
    out_dtype = a.dtype
    y = _matmul(a, b, None if out is None else out[0])
    y = np.asarray(y)
    return y if y.dtype == out_dtype else y.astype(out_dtype)


_DOT, _MATMUL, _GENERAL = 0, 1, 2
BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def matmul_route(a, b) -> int:
    """How to multiply operands of these shapes/dtypes; raises for invalid ones."""
    if a.ndim == 0 or b.ndim == 0:
        raise KernelError("MatMul: inputs must have rank >= 1")
    if a.dtype != b.dtype:
        raise KernelError(f"MatMul: input dtypes differ ({a.dtype} vs {b.dtype})")
    if _compute_dtype(a.dtype) != a.dtype or a.dtype.kind not in "fiu" or a.ndim == b.ndim == 1:
        return _GENERAL  # (float16 via float32; a 1-D . 1-D product is made a 0-d array)
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise KernelError(f"MatMul: incompatible shapes {a.shape} x {b.shape}") from None
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise KernelError(f"MatMul: incompatible shapes {a.shape} x {b.shape}")
    if a.ndim <= 2 and b.ndim <= 2 and a.dtype in BLAS_DTYPES:
        return _DOT
    return _MATMUL


# --------------------------------------------------------------------------- Gemm


def _gemm_dims(ctx, a_shape, b_shape):
    ta, tb = int(ctx.get("transA", 0)), int(ctx.get("transB", 0))
    m, k1 = (a_shape[1], a_shape[0]) if ta else (a_shape[0], a_shape[1])
    k2, n = (b_shape[1], b_shape[0]) if tb else (b_shape[0], b_shape[1])
    return m, k1, k2, n


def gemm_shape(ctx, a, b, c=None):
    for name, info in (("A", a), ("B", b)):
        if info.shape is not None and len(info.shape) != 2:
            raise ShapeInferenceError(f"Gemm: input {name} must be 2-D, got shape {info.shape}")
    if a.shape is None or b.shape is None:
        m = n = None
        if a.shape is not None:
            m = a.shape[1] if int(ctx.get("transA", 0)) else a.shape[0]
        if b.shape is not None:
            n = b.shape[0] if int(ctx.get("transB", 0)) else b.shape[1]
        return [TensorInfo(a.dtype, (m, n))]
    m, k1, k2, n = _gemm_dims(ctx, a.shape, b.shape)
    if not _dims_match(k1, k2):
        raise ShapeInferenceError(f"Gemm: inner dimensions differ: A {a.shape}, B {b.shape} "
                                  f"(transA={ctx.get('transA', 0)}, transB={ctx.get('transB', 0)})")
    if c is not None and c.shape is not None:
        if len(c.shape) > 2:
            raise ShapeInferenceError(f"Gemm: C must have rank <= 2, got {c.shape}")
        # C must be unidirectionally broadcastable to (M, N)
        for cd, od in zip(reversed(c.shape), (n, m)):
            if isinstance(cd, int) and cd != 1 and not _dims_match(cd, od):
                raise ShapeInferenceError(f"Gemm: C {c.shape} does not broadcast to ({m}, {n})")
    return [TensorInfo(a.dtype, (m, n))]


def _broadcasts_to(shape, target) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


class _GemmPlan:
    """What a Gemm node derives from its attributes and operand shapes/dtypes, once."""

    __slots__ = ("key", "fast", "trans_a", "trans_b", "alpha", "beta")

    def __init__(self, ctx, key, a, b, c):
        if a.ndim != 2 or b.ndim != 2:
            raise KernelError(f"Gemm: A and B must be 2-D, got {a.shape} and {b.shape}")
        m, k1, k2, n = _gemm_dims(ctx, a.shape, b.shape)
        if k1 != k2:
            raise KernelError(f"Gemm: inner dimensions differ: {(m, k1)} x {(k2, n)} after transposition")
        beta = float(ctx.get("beta", 1.0))
        if c is not None and beta != 0.0 and (c.ndim > 2 or not _broadcasts_to(c.shape, (m, n))):
            raise KernelError(f"Gemm: C {c.shape} does not broadcast to {(m, n)}")
        self.key = key
        dt = a.dtype
        # the hot path: float32/float64 throughout, computed exactly as the general path does
        self.fast = dt in BLAS_DTYPES and b.dtype == dt and (c is None or c.dtype == dt)
        self.trans_a = bool(int(ctx.get("transA", 0)))
        self.trans_b = bool(int(ctx.get("transB", 0)))
        alpha = float(ctx.get("alpha", 1.0))
        self.alpha = None if alpha == 1.0 else dt.type(alpha)
        # C's factor: None when C is absent or ignored (beta 0), 1.0 when added as is
        self.beta = None if c is None or beta == 0.0 else (1.0 if beta == 1.0 else dt.type(beta))


def _gemm_prepare(ctx, a, b, c=None):
    """Gemm's first phase, given static operand infos: the plan, made once, and a run that
    is the BLAS call and its epilogue alone (no per-call checks or lookups)."""
    like = stand_ins(a, b, c)
    if like is None:
        return None
    plan = _GemmPlan(ctx, None, *like)
    if not plan.fast:
        return None
    dtype, trans_a, trans_b, alpha, beta = a.dtype, plan.trans_a, plan.trans_b, plan.alpha, plan.beta

    def gemm_prepared(ctx, a, b, c=None, out=None):
        if trans_a:
            a = a.T
        if trans_b:
            b = b.T
        if out is not None and out[0].flags.c_contiguous and out[0].dtype == dtype:
            y = np.dot(a, b, out=out[0])
        else:
            y = np.dot(a, b)
        if alpha is not None:
            y *= alpha
        if beta is not None:
            np.add(y, c if beta == 1.0 else beta * c, out=y)
        return y

    return gemm_prepared


@kernel("Gemm", since=1, shape=gemm_shape, writes_out=True, prepare=_gemm_prepare)
def gemm(ctx, a, b, c=None, out=None):
    key = (a.shape, b.shape, a.dtype, b.dtype, None if c is None else (c.shape, c.dtype))
    plan = ctx.scratch.get("gemm plan")
    if plan is None or plan.key != key:
        plan = ctx.scratch["gemm plan"] = _GemmPlan(ctx, key, a, b, c)
    if not plan.fast:
        return _gemm_general(ctx, a, b, c, out)
    if plan.trans_a:
        a = a.T
    if plan.trans_b:
        b = b.T
    if out is not None and out[0].flags.c_contiguous and out[0].dtype == plan.key[2]:
        y = np.dot(a, b, out=out[0])
    else:
        y = np.dot(a, b)
    if plan.alpha is not None:
        y *= plan.alpha
    beta = plan.beta
    if beta is not None:
        np.add(y, c if beta == 1.0 else beta * c, out=y)
    return y


def _gemm_general(ctx, a, b, c=None, out=None):
    alpha = float(ctx.get("alpha", 1.0))
    beta = float(ctx.get("beta", 1.0))
    out_dtype = a.dtype
    cdt = _compute_dtype(a.dtype)
    if int(ctx.get("transA", 0)):
        a = a.T
    if int(ctx.get("transB", 0)):
        b = b.T
    if out is not None and out[0].dtype == cdt:
        y = np.matmul(a.astype(cdt, copy=False), b.astype(cdt, copy=False), out=out[0])
    else:
        y = np.matmul(a.astype(cdt, copy=False), b.astype(cdt, copy=False))
    if alpha != 1.0:
        if cdt.kind == "f":
            y *= cdt.type(alpha)
        else:
            y = (y * alpha).astype(cdt)
    if c is not None and beta != 0.0:
        if beta == 1.0:
            y += c.astype(cdt, copy=False)
        elif cdt.kind == "f":
            y += cdt.type(beta) * c.astype(cdt, copy=False)
        else:
            y += (c * beta).astype(cdt)
    return y if y.dtype == out_dtype else y.astype(out_dtype)


# --------------------------------------------------------------------------- Einsum

_TERM = re.compile(r"^(?:[A-Za-z]|\.\.\.)*$")


def _parse_einsum(equation: str, n_inputs: int, err):
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->", 1)
    else:
        lhs, rhs = eq, None
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        raise err(f"Einsum: equation {equation!r} has {len(terms)} operands but the node has {n_inputs} inputs")
    for t in terms + ([rhs] if rhs is not None else []):
        if not _TERM.match(t) or t.count("...") > 1:
            raise err(f"Einsum: invalid term {t!r} in equation {equation!r}")
    return eq, terms, rhs


def _split_term(term):
    """'ab...c' -> (['a', 'b'], has_ellipsis, ['c'])"""
    if "..." in term:
        pre, post = term.split("...")
        return list(pre), True, list(post)
    return list(term), False, []


def _einsum_shape(ctx, *infos):
    eq = ctx.get("equation")
    if not isinstance(eq, str):
        raise ShapeInferenceError("Einsum: attribute 'equation' is required")
    eq, terms, rhs = _parse_einsum(eq, len(infos), ShapeInferenceError)
    dtype = infos[0].dtype
    if any(i.shape is None for i in infos):
        if rhs is not None and "..." not in rhs:
            return [TensorInfo(dtype, (None,) * len(rhs))]
        return [TensorInfo(dtype, None)]
    letters: dict[str, object] = {}
    ell_shapes = []
    counts: dict[str, int] = {}
    for term, info in zip(terms, infos):
        pre, has_ell, post = _split_term(term)
        shape = tuple(info.shape)
        n_ell = len(shape) - len(pre) - len(post)
        if n_ell < 0 or (n_ell > 0 and not has_ell):
            raise ShapeInferenceError(f"Einsum: term {term!r} does not match input rank {len(shape)}")
        dims = list(zip(pre, shape[:len(pre)])) + list(zip(post, shape[len(shape) - len(post):]))
        if has_ell:
            ell_shapes.append(shape[len(pre):len(shape) - len(post)])
        for letter, d in dims:
            counts[letter] = counts.get(letter, 0) + 1
            prev = letters.get(letter)
            if prev is None or prev == 1:
                letters[letter] = d
            elif isinstance(prev, int) and isinstance(d, int) and d not in (1, prev):
                raise ShapeInferenceError(f"Einsum: dimension {letter!r} is both {prev} and {d}")
    ell = broadcast(*ell_shapes) if ell_shapes else ()
    if rhs is None:
        out_letters = sorted(k for k, v in counts.items() if v == 1)
        return [TensorInfo(dtype, tuple(ell) + tuple(letters[k] for k in out_letters))]
    pre, has_ell, post = _split_term(rhs)
    for letter in pre + post:
        if letter not in letters:
            raise ShapeInferenceError(f"Einsum: output letter {letter!r} does not appear in the inputs")
    out = [letters[k] for k in pre] + (list(ell) if has_ell else []) + [letters[k] for k in post]
    return [TensorInfo(dtype, tuple(out))]


@kernel("Einsum", since=12, shape=_einsum_shape)
def einsum(ctx, *inputs):
    eq = ctx.get("equation")
    if not isinstance(eq, str):
        raise KernelError("Einsum: attribute 'equation' is required")
    eq, _, _ = _parse_einsum(eq, len(inputs), KernelError)
    out_dtype = inputs[0].dtype
    cdt = _compute_dtype(out_dtype)
    ops = [x.astype(cdt, copy=False) for x in inputs]
    try:
        y = np.einsum(eq, *ops, optimize=True)
    except ValueError as e:
        raise KernelError(f"Einsum: {e}") from e
    y = np.asarray(y)
    return y if y.dtype == out_dtype else y.astype(out_dtype)


# --------------------------------------------------------------------------- Det


def _det_shape(ctx, x):
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    if len(x.shape) < 2 or not _dims_match(x.shape[-1], x.shape[-2]):
        raise ShapeInferenceError(f"Det: input must be [..., M, M], got {x.describe()}")
    return [TensorInfo(x.dtype, tuple(x.shape[:-2]))]


@kernel("Det", since=11, shape=_det_shape)
def det(ctx, x):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise KernelError(f"Det: input must be [..., M, M], got shape {x.shape}")
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise KernelError(f"Det expects a floating-point input, got {x.dtype}")
    cdt = _compute_dtype(x.dtype)
    # LU factorization with partial pivoting (LAPACK getrf), batched over the leading axes
    d = np.linalg.det(x.astype(cdt, copy=False))
    return np.asarray(d).astype(x.dtype, copy=False)
