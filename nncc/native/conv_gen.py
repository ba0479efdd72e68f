"""The partition writer's convolution and pooling steps: a convolution (blocked, else
nn_conv2d over NCHW) with its fused activation, a residual Add written by the convolution
before it, per-channel scale and shift, and pooling.

A mixin of the partition writer (nncc/native/codegen.py): it uses its ``step``, ``ptr``,
``shape``, ``only_consumer``, ``deferred``, ``absorbed`` and ``steps`` members, the
blocked layout's ``blocked_conv``, ``blocked_scale_shift``, ``blocked_pool``, ``as_plain`` and
``as_blocked``, and the
elementwise steps' ``clip_bounds``.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.ir.graph import Node
from nncc.native import gemm_amx_gen
from nncc.native import grouped_pointwise as gp
from nncc.native import grouped_pointwise_amx as gpa
from nncc.native.activations import CODES
from nncc.native.c_literal import c_float
from nncc.native.kernel import scratch_arg
from nncc.native.graph_query import is_pair_sum

POOL_OPS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
GLOBAL_POOLS = {"GlobalAveragePool", "GlobalMaxPool"}  # of any rank from 3: one value per row of N * C
_MAX_ROWS_CHUNK = 64  # rows per task of a global max
# Input channels a group has at most for a grouped 1x1 convolution over NCHW to run as one
# step of register tiles (grouped_pointwise) instead of a BLAS product per group and an
# epilogue pass. Measured on ShuffleNet's layers at one thread: 6 channels a group took 0.4
# of the BLAS path's time, 34 0.7, 68 1.05-1.2 (BLAS's blocking wins on longer sums).
GROUPED_POINTWISE_CHANNELS = 48


class ConvSteps:
    """Steps of convolutions, their fused epilogues, scale-shift and pooling."""

    def _activation(self, attrs) -> tuple[int, float, float]:
        act = attrs.get("activation", "") or ""
        p0 = p1 = 0.0
        if act == "Clip":
            p0 = float(attrs.get("activation_min", -np.inf))
            p1 = float(attrs.get("activation_max", np.inf))
        elif act == "LeakyRelu":
            p0 = float(attrs.get("activation_alpha", 0.01))
        elif act == "HardSigmoid":
            p0 = float(attrs.get("activation_alpha", 0.2))
            p1 = float(attrs.get("activation_beta", 0.5))
        return CODES[act], p0, p1

    def conv(self, node: Node, residual: str | None = None, target: str | None = None,
             act=None, defer: bool = True) -> None:
        out = node.outputs[0]
        if defer and residual is None and not node.attrs.get("activation"):
            user = self.only_consumer(out)
            if user is not None and is_pair_sum(user) and \
                    self.shape(user.outputs[0]) == self.shape(out) and \
                    all(self.shape(i) == self.shape(out) for i in user.inputs):
                self.deferred[out] = node  # written by the Add, with the residual
                return
        n, c, h, w = self.shape(node.inputs[0])
        k, cg, kh, kw = self.shape(node.inputs[1])
        _, _, oh, ow = self.shape(out)
        a = node.attrs
        group = int(a.get("group", 1))
        sh, sw = (a.get("strides") or [1, 1])
        dh, dw = (a.get("dilations") or [1, 1])
        pads = a.get("pads") or [0, 0, 0, 0]
        if a.get("auto_pad", "NOTSET") == "VALID":
            pads = [0, 0, 0, 0]
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        code, p0, p1 = act if act is not None else self._activation(a)
        target = target or out
        if self.blocked_conv(node, pads, bias, residual, target, (code, p0, p1), c_float):
            return
        for name in (node.inputs[0], residual):
            if name:
                self.as_plain(name)
        depthwise = group == c == k
        direct = kh == kw == 1 and sh == sw == 1 and not any(pads)
        weights = self.constant_value(node.inputs[1])
        if direct and not depthwise and weights is not None and gpa.applies(c, k, group, self.vl) and \
                self.weights_packing(node) is gemm_amx_gen.AMX:
            self.grouped_pointwise(node, weights, bias, residual, target, (code, p0, p1), tiles=True)
            return
        if direct and group > 1 and not depthwise and weights is not None and cg <= GROUPED_POINTWISE_CHANNELS:
            self.grouped_pointwise(node, weights, bias, residual, target, (code, p0, p1))
            return
        scratch = 0 if depthwise or direct else cg * kh * kw * oh * ow * 4
        target = target or out
        self.step(
            f"nn_conv2d({self.ptr(node.inputs[0])}, {self.ptr(node.inputs[1])}, "
            f"{self.ptr(bias) if bias else '0'}, {self.ptr(residual) if residual else '0'}, {self.ptr(target)}, "
            f"{n}, {c}, {h}, {w}, {k}, {oh}, {ow}, {kh}, {kw}, {sh}, {sw}, {pads[0]}, {pads[1]}, {dh}, {dw}, "
            f"{group}, {code}, {c_float(p0)}, {c_float(p1)}, (float *){scratch_arg(scratch)});",
            [node.inputs[0], node.inputs[1], bias, residual], [target], scratch, blas=True)

    def grouped_pointwise(self, node: Node, weights, bias: str | None, residual: str | None, target: str,
                          act: tuple[int, float, float], tiles: bool = False) -> None:
        """A grouped 1x1 stride-1 convolution over NCHW (its groups not whole channel blocks):
        one step of register tiles that each stay in a group (nncc/native/grouped_pointwise.py);
        with ``tiles``, in bfloat16 on AMX tiles (nncc/native/grouped_pointwise_amx.py), that
        float32 step kept for where the tiles are refused."""
        x = node.inputs[0]
        n, c, h, w = self.shape(x)
        k, group = self.shape(node.inputs[1])[0], int(node.attrs.get("group", 1))
        wname = self.pack(node.inputs[1], "gpw", gp.pack_weights(weights, group))
        ptrs = {"x": self.ptr(x), "w": self.ptr(wname), "b": self.ptr(bias) if bias else None,
                "r": self.ptr(residual) if residual else None, "y": self.ptr(target)}
        code, p0, p1 = act
        support, call = gp.grouped_pointwise(n, c, h * w, k, group, self.vl, ptrs, code, c_float(p0), c_float(p1))
        reads, scratch = [x, wname, bias, residual], 0
        if tiles:
            tiles_name = self.pack(node.inputs[1], gpa.FORM, gpa.pack_weights(weights, group))
            ptrs["wa"] = self.ptr(tiles_name)
            reads.append(tiles_name)
            scratch = gpa.scratch_bytes(n, c, h * w, k, group)
            amx_support, call = gpa.conv(n, c, h * w, k, group, ptrs, code, c_float(p0), c_float(p1),
                                         scratch_arg(scratch), call)
            support = support + amx_support
        self.step(call, reads, [target], scratch, support=self.simd + support)

    def scale_shift(self, node: Node) -> None:
        """y = act(x * scale[c] + shift[c]): per-channel vectors over axis 1."""
        act = self._activation(node.attrs)
        if self.blocked_scale_shift(node, act, c_float):
            return
        self.plain_inputs(node)
        x, scale, shift = node.inputs[:3]
        y = node.outputs[0]
        shape = self.shape(x)
        outer, c, inner = shape[0], shape[1], math.prod(shape[2:])
        code, p0, p1 = act
        self.step(f"for (int64_t n = 0; n < {outer}; n++) for (int64_t c = 0; c < {c}; c++) {{\n"
                  f"  const float s = {self.ptr(scale)}[c], b = {self.ptr(shift)}[c];\n"
                  f"  const float *x = {self.ptr(x)} + (n * {c} + c) * {inner};\n"
                  f"  float *y = {self.ptr(y)} + (n * {c} + c) * {inner};\n"
                  f"  for (int64_t i = 0; i < {inner}; i++) y[i] = nn_act({code}, x[i] * s + b, {c_float(p0)}, {c_float(p1)});\n"
                  "}", [x, scale, shift], [y])

    def max_rows(self, x: str, y: str, rows: int, n: int) -> None:
        """y[r] = the largest of row r's n values, a NaN anywhere in it giving NaN (as
        MaxPool's windows and the portable kernel), over the pool by chunks of rows."""
        chunks = -(-rows // _MAX_ROWS_CHUNK)
        support = f"""typedef struct {{ const float *x; float *y; }} max_rows_job;
static void max_rows_chunks(void *ctx, int64_t lo, int64_t hi) {{
    const max_rows_job *j = ctx;
    int64_t end = hi * {_MAX_ROWS_CHUNK} < {rows} ? hi * {_MAX_ROWS_CHUNK} : {rows};
    for (int64_t r = lo * {_MAX_ROWS_CHUNK}; r < end; r++) {{
        const float *xr = j->x + r * {n};
        float m = -INFINITY;
        for (int64_t i = 0; i < {n}; i++) {{ float v = xr[i]; m = v > m || v != v ? v : m; }}
        j->y[r] = m;
    }}
}}
"""
        self.step(f"max_rows_job job = {{{self.ptr(x)}, {self.ptr(y)}}}; "
                  f"nn_parallel({chunks}, {rows * n}, max_rows_chunks, &job);", [x], [y], support=support)

    def residual(self, add: Node) -> None:
        conv_out = next(i for i in add.inputs if i in self.deferred)
        other = add.inputs[1] if add.inputs[0] == conv_out else add.inputs[0]
        conv = self.deferred.pop(conv_out)
        if other in self.deferred:  # both operands are convolutions: write one plainly first
            shortcut = self.deferred.pop(other)
            self.conv(shortcut, defer=False)
            self.steps[-1].label = f"Conv {shortcut.name}"
        target, act = add.outputs[0], (0, 0.0, 0.0)
        user = self.only_consumer(target)
        if user is not None and not user.domain and user.op_type in ("Relu", "Clip"):
            bounds = self.clip_bounds(user) if user.op_type == "Clip" else None
            if user.op_type == "Relu" or bounds is not None:
                act = (CODES["Relu"], 0.0, 0.0) if user.op_type == "Relu" else (CODES["Clip"], *bounds)
                self.absorbed.add(id(user))
                target = user.outputs[0]
        self.conv(conv, residual=other, target=target, act=act)

    def pool(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        if node.op_type in GLOBAL_POOLS:
            shape = self.shape(x)
            rows, n = shape[0] * shape[1], math.prod(shape[2:])
            if node.op_type == "GlobalMaxPool":
                return self.max_rows(x, y, rows, n)
            return self.step(f"nn_mean_rows({self.ptr(x)}, {self.ptr(y)}, {rows}, {n});", [x], [y])
        n, c, h, w = self.shape(x)
        if node.op_type == "AveragePool" and 2 * c >= self.vl:
            # the NCHW average pool is a scalar loop checking every tap against the edges
            # (a ShuffleNet's 3x3 stride-2 pool on 136 channels at 28x28 took 0.43 ms); two
            # reorders and the blocked pool, a vector per tap, cost a tenth of that
            self.as_blocked(x)
            self.blocked_pool(node)
            return
        _, _, oh, ow = self.shape(y)
        a = node.attrs
        kh, kw = a["kernel_shape"]
        sh, sw = a.get("strides") or [1, 1]
        pads = a.get("pads") or [0, 0, 0, 0]
        if a.get("auto_pad", "NOTSET") == "VALID":
            pads = [0, 0, 0, 0]
        if node.op_type == "MaxPool":
            dh, dw = a.get("dilations") or [1, 1]
            self.step(f"nn_maxpool2d({self.ptr(x)}, {self.ptr(y)}, {n * c}, {h}, {w}, {oh}, {ow}, {kh}, {kw}, "
                      f"{sh}, {sw}, {pads[0]}, {pads[1]}, {dh}, {dw});", [x], [y])
        else:
            self.step(f"nn_avgpool2d({self.ptr(x)}, {self.ptr(y)}, {n * c}, {h}, {w}, {oh}, {ow}, {kh}, {kw}, "
                      f"{sh}, {sw}, {pads[0]}, {pads[1]}, {pads[2]}, {pads[3]}, "
                      f"{int(a.get('count_include_pad', 0))});", [x], [y])
