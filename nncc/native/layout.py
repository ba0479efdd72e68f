"""Where a native partition keeps its activations in the channel-blocked layout.

Decided node by node, in the partition's order: a convolution always writes the blocked
layout; pooling, global average pooling, elementwise ops, Sum and channel Concat stay
blocked when their data input is (a Concat with inputs in both layouts when that reorders
fewer elements); every other op reads NCHW. A value lives in one layout
or both: ``as_plain`` and ``as_blocked`` give the name of the buffer holding the layout
asked for, adding a reorder step the first time it is needed, so reorders happen only
where a blocked value meets an op (or a partition edge) that needs NCHW, and the other
way round. A partition's outputs are always handed back in NCHW.

This is a mixin of the partition writer (nncc/native/codegen.py): it uses its ``step``,
``ptr``, ``shape``, ``pack`` and ``alias`` members.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.ir.graph import Node, TensorInfo
from nncc.native import blocked_conv as bc
from nncc.native import blocked_ops as bo
from nncc.native import conv_amx, conv_bf16, conv_stem_bf16, gemm_amx_gen, gemm_bf16_gen
from nncc.native import narrow_group_conv, winograd
from nncc.native.graph_query import CONV_OPS
from nncc.native.concat_slices import Slice
from nncc.native.kernel import SCRATCH
from nncc.native.precision import convolutions_in_bf16

F32 = np.dtype(np.float32)


class BlockedLayout:
    vl: int
    blocked: dict[str, str]  # value -> the name of its blocked buffer
    plain_ready: set[str]  # blocked values whose NCHW form has been written too

    def init_layout(self) -> None:
        self.blocked = {}
        self.plain_ready = set()

    # -- the two layouts of a value ---------------------------------------------------

    def is_blocked(self, name: str) -> bool:
        return name in self.blocked

    def blocked_buffer(self, name: str) -> str:
        """A new blocked buffer for value ``name`` (4-D), which is produced blocked."""
        n, c, h, w = self.shape(name)
        buf = f"{name}#nchw{self.vl}c"
        self.infos[buf] = TensorInfo(F32, (n, bc.blocks(c, self.vl), h, w, self.vl))
        self.blocked[name] = buf
        return buf

    def as_blocked(self, name: str) -> str:
        if name in self.blocked:
            return self.blocked[name]
        shape = self.shape(name)
        buf = self.blocked_buffer(name)
        self.plain_ready.add(name)
        support, code = bo.to_blocked(shape, self.vl, self.ptr(name), self.ptr(buf))
        self.step(code, [name], [buf], support=self.simd + support)
        self.steps[-1].label = f"reorder {name} to NCHW{self.vl}c"
        return buf

    def as_plain(self, name: str) -> str:
        if name not in self.blocked or name in self.plain_ready:
            return name
        self.plain_ready.add(name)
        buf = self.blocked[name]
        n, c, h, w = self.shape(name)
        if h * w == 1 and c % self.vl == 0 and name not in self.outputs:
            self.alias[name] = buf  # [N, C, 1, 1] with whole blocks: the same bytes
            return name
        support, code = bo.to_plain((n, c, h, w), self.vl, self.ptr(buf), self.ptr(name))
        self.step(code, [buf], [name], support=self.simd + support)
        self.steps[-1].label = f"reorder {name} to NCHW"
        return name

    def plain_inputs(self, node: Node) -> None:
        for name in node.inputs:
            if name:
                self.as_plain(name)

    def finish_blocked_output(self, name: str) -> None:
        """A partition output produced blocked is written back in NCHW at once."""
        if name in self.outputs:
            self.as_plain(name)

    # -- convolution --------------------------------------------------------------------

    def geometry(self, node: Node, pads) -> bc.Conv2d:
        n, c, h, w = self.shape(node.inputs[0])
        k, _, kh, kw = self.shape(node.inputs[1])
        _, _, oh, ow = self.shape(node.outputs[0])
        a = node.attrs
        sh, sw = a.get("strides") or [1, 1]
        dh, dw = a.get("dilations") or [1, 1]
        return bc.Conv2d(n, c, h, w, k, oh, ow, kh, kw, sh, sw, dh, dw, pads[0], pads[1], pads[2], pads[3],
                         int(a.get("group", 1)))

    def blocked_conv(self, node: Node, pads, bias: str | None, residual: str | None, target: str,
                     act: tuple[int, float, float], fmt) -> bool:
        """Write ``node`` as a blocked convolution; False when it cannot be (grouped
        convolutions other than depthwise whose groups are neither whole channel blocks nor
        narrow ones dividing a block, or weights that are not constants)."""
        g = self.geometry(node, pads)
        weights = self.constant_value(node.inputs[1])
        bias_value = self.constant_value(bias) if bias else None
        if weights is None or (bias and bias_value is None):
            return False
        # a grouped 1x1 stride-1 one over an NCHW input keeps the NCHW register tiles
        # (conv_gen.grouped_pointwise): as fast a step, without the reorders around it
        narrow = narrow_group_conv.applies(g, self.vl) and \
            (node.inputs[0] in self.blocked or not narrow_group_conv.pointwise(g))
        if g.group != 1 and not g.depthwise and not g.whole_block_groups(self.vl) and not narrow:
            return False
        vl = self.vl
        code_act, p0, p1 = act
        ptrs = {"y": self.ptr(self.blocked_buffer(target))}
        reads = []
        use_winograd = bf16 = stem_tiles = False
        if g.depthwise:
            x = self.as_blocked(node.inputs[0])
            wname = self.pack(node.inputs[1], f"dw{vl}", bc.pack_depthwise_weights(weights, vl))
        elif narrow:  # groups narrower than a block (nncc/native/narrow_group_conv.py)
            x = self.as_blocked(node.inputs[0])
            wname = self.pack(node.inputs[1], f"narrow{vl}", narrow_group_conv.pack_weights(weights, vl))
        elif winograd.applies(g, vl) and (node.inputs[0] in self.blocked or g.c >= vl) and not \
                (self.weights_packing(node) is gemm_amx_gen.AMX and conv_amx.applies(g, vl)):
            use_winograd = True
            x = self.as_blocked(node.inputs[0])
            packed, ocb = winograd.pack_weights(weights, g, vl)
            wname = self.pack(node.inputs[1], f"wino{vl}x{ocb}", packed)
        else:
            plain_input = node.inputs[0] not in self.blocked and g.c < vl
            x = node.inputs[0] if plain_input else self.as_blocked(node.inputs[0])
            ocb, _ = bc.choose_tiling(g, vl)
            packed = bc.pack_direct_weights(weights, vl, ocb, plain_input)
            # in bfloat16 pairs where this layer's arithmetic is bf16 (asked of the Conv itself: a
            # residual one is written while its Add is the node being written) and vdpbf16ps
            # pays; the packed form names it, so the plan's record counts the layer
            # (nncc/preparing/calibration.low_layers)
            packing = self.weights_packing(node)
            # on AMX tiles (tdpbf16ps) the 1x1 stride-1 ones (nncc/native/conv_amx.py), which
            # keep the vdpbf16ps convolution for where the tiles are refused
            on_tiles = packing is gemm_amx_gen.AMX and not plain_input and conv_amx.applies(g, vl)
            bf16 = on_tiles or (packing is gemm_bf16_gen.BF16 and not plain_input and
                                convolutions_in_bf16(self.arithmetic))
            # a stem (few channels of a plain input) on tiles too (nncc/native/conv_stem_bf16.py),
            # which keeps this float32 convolution for where the tiles are refused
            stem_tiles = packing is gemm_amx_gen.AMX and plain_input and conv_stem_bf16.pays(g, vl)
            if bf16:
                wname = self.pack(node.inputs[1], f"conv{vl}x{ocb}bf16", conv_bf16.pack_weights(packed))
                if on_tiles:  # the tiles' own packing (32 input channels per tap); the other is the fallback's
                    tiles_name = self.pack(node.inputs[1], conv_amx.FORM, conv_amx.pack_weights(weights))
                    ptrs["wa"] = self.ptr(tiles_name)
                    reads.append(tiles_name)
            else:
                wname = self.pack(node.inputs[1], f"conv{vl}x{ocb}{'p' if plain_input else ''}", packed)
        ptrs.update(x=self.ptr(x), w=self.ptr(wname))
        reads += [x, wname]
        if bias:
            bname = self.pack(bias, f"c{vl}", bc.pack_channels(bias_value, g.k, vl))
            ptrs["b"] = self.ptr(bname)
            reads.append(bname)
        if residual:
            rname = self.as_blocked(residual)
            ptrs["r"] = self.ptr(rname)
            reads.append(rname)
        scratch = 0
        if g.depthwise:
            support, code = bc.depthwise_conv(g, vl, ptrs, code_act, fmt(p0), fmt(p1))
        elif narrow:
            support, code = narrow_group_conv.narrow_group_conv(g, vl, ptrs, code_act, fmt(p0), fmt(p1))
        elif use_winograd:
            support, code, scratch = winograd.winograd_conv(g, vl, ptrs, code_act, fmt(p0), fmt(p1), SCRATCH)
        else:
            if bf16:
                scratch = conv_bf16.scratch_bytes(g.n, g.c, g.h, g.w, vl)
                ptrs["xb"] = SCRATCH
            support, code = bc.direct_conv(g, vl, plain_input, ptrs, code_act, fmt(p0), fmt(p1), bf16=bf16)
            if stem_tiles:
                sname = self.pack(node.inputs[1], f"stem{vl}bf16", conv_stem_bf16.pack_weights(weights, vl))
                reads.append(sname)
                scratch = conv_stem_bf16.scratch_bytes(g)
                stem_support, code = conv_stem_bf16.conv(g, vl, {**ptrs, "w": self.ptr(sname)}, code_act,
                                                         fmt(p0), fmt(p1), SCRATCH, code)
                support += stem_support
            if on_tiles:
                scratch = max(scratch, conv_amx.scratch_bytes(g, vl))
                tiles_support, code = conv_amx.conv(g, vl, ptrs, code_act, fmt(p0), fmt(p1), SCRATCH, code)
                support += tiles_support
        self.step(code, reads, [self.blocked[target]], scratch=scratch, support=self.simd + support)
        self.finish_blocked_output(target)
        return True

    def constant_value(self, name: str):
        if name in self.graph.initializers:
            return np.asarray(self.graph.initializers[name], np.float32)
        info = self.infos.get(name)
        return None if info is None or info.value is None else np.asarray(info.value, np.float32)

    # -- ops that keep the layout -------------------------------------------------------

    def blocked_pool(self, node: Node) -> bool:
        x, y = node.inputs[0], node.outputs[0]
        if x not in self.blocked:
            return False
        shape = self.shape(x)
        if node.op_type == "GlobalAveragePool":
            support, code = bo.global_average(shape, self.vl, self.ptr(self.blocked[x]),
                                              self.ptr(self.blocked_buffer(y)))
        elif node.op_type == "GlobalMaxPool":
            support, code = bo.global_max(shape, self.vl, self.ptr(self.blocked[x]), self.ptr(self.blocked_buffer(y)))
        else:
            a = node.attrs
            pads = a.get("pads") or [0, 0, 0, 0]
            if a.get("auto_pad", "NOTSET") == "VALID":
                pads = [0, 0, 0, 0]
            pads = [pads[0], pads[1], pads[2], pads[3]]
            kind = "max" if node.op_type == "MaxPool" else "avg"
            dil = (a.get("dilations") or [1, 1]) if kind == "max" else [1, 1]
            support, code = bo.pool(kind, shape, self.shape(y)[2:], a["kernel_shape"], a.get("strides") or [1, 1],
                                    pads, dil, bool(a.get("count_include_pad", 0)), self.vl,
                                    self.ptr(self.blocked[x]), self.ptr(self.blocked_buffer(y)))
        self.step(code, [self.blocked[x]], [self.blocked[y]], support=self.simd + support)
        self.finish_blocked_output(y)
        return True

    def shuffle_into_blocked(self, node: Node) -> bool:
        """A channel shuffle read by a convolution (ShuffleNet's Reshape to [N, G, K, H, W],
        Transpose swapping G and K, Reshape back to [N, K * G, H, W]): written as the reorder
        into the blocked layout the convolution needs anyway, each output channel read from
        its source channel's plane, instead of a Transpose and then that reorder. The
        Reshape after it is absorbed; a reader that needs NCHW gets a reorder back."""
        x, y = node.inputs[0], node.outputs[0]
        shape = self.shape(x)
        if len(shape) != 5 or list(node.attrs.get("perm") or []) != [0, 2, 1, 3, 4]:
            return False
        after = self.only_consumer(y)
        if after is None or after.domain or after.op_type != "Reshape":
            return False
        n, g, k, h, w = shape
        out = after.outputs[0]
        if tuple(self.shape(out)) != (n, g * k, h, w):
            return False
        if not any((user.domain, user.op_type) in CONV_OPS for user in self.consumers.get(out, [])):
            return False
        # output channel c = k' * G + g' is the input's channel g' * K + k'
        channels = [(c % g) * k + c // g for c in range(g * k)]
        dst = self.blocked_buffer(out)
        support, code = bo.to_blocked((n, g * k, h, w), self.vl, self.ptr(x), self.ptr(dst), channels)
        self.step(code, [x], [dst], support=self.simd + support)
        self.absorbed.add(id(after))
        self.finish_blocked_output(out)
        return True

    def blocked_scale_shift(self, node: Node, act, fmt) -> bool:
        x, scale, shift = node.inputs[:3]
        y = node.outputs[0]
        values = [self.constant_value(scale), self.constant_value(shift)]
        if x not in self.blocked or len(self.shape(x)) != 4 or any(v is None for v in values):
            return False
        c = self.shape(x)[1]
        s_name = self.pack(scale, f"c{self.vl}", bc.pack_channels(values[0], c, self.vl))
        b_name = self.pack(shift, f"c{self.vl}", bc.pack_channels(values[1], c, self.vl))
        src, dst = self.blocked[x], self.blocked_buffer(y)
        support, code = bo.scale_shift(self.shape(x), self.vl, self.ptr(src), self.ptr(s_name), self.ptr(b_name),
                                       self.ptr(dst), act[0], fmt(act[1]), fmt(act[2]))
        self.step(code, [src, s_name, b_name], [dst], support=self.simd + support)
        self.finish_blocked_output(y)
        return True

    def blocked_unary(self, node: Node, expr: str) -> bool:
        x, y = node.inputs[0], node.outputs[0]
        if x not in self.blocked or len(self.shape(y)) != 4:
            return False
        src, dst = self.blocked[x], self.blocked_buffer(y)
        size = math.prod(self.shape(dst))
        self.step(f"for (int64_t i = 0; i < {size}; i++) {{ float v = {self.ptr(src)}[i]; "
                  f"{self.ptr(dst)}[i] = {expr}; }}", [src], [dst])
        self.finish_blocked_output(y)
        return True

    def blocked_operand(self, name: str, out) -> tuple[str, list[int]] | None:
        """(buffer, 5-D strides over [N, CB, H, W, VL]) to read ``name`` broadcast to the
        blocked output ``out``; None when it cannot be read that way."""
        vl = self.vl
        shape = [1] * (4 - len(self.shape(name))) + list(self.shape(name))
        n, c, h, w = shape
        if name in self.blocked or (c == out[1] and c > 1):
            if name in self.blocked:
                buf = self.blocked[name]
            else:
                value = self.constant_value(name)
                if value is not None:
                    blocked = np.zeros((n, bc.blocks(c, vl) * vl, h, w), np.float32)
                    blocked[:, :c] = value.reshape(shape)
                    blocked = blocked.reshape(n, -1, vl, h, w).transpose(0, 1, 3, 4, 2)
                    buf = self.pack(name, f"nchw{vl}c", blocked)
                elif shape == list(out):
                    buf = self.as_blocked(name)
                else:
                    return None
            cb = bc.blocks(c, vl)
            strides = [cb * h * w * vl, h * w * vl, w * vl, vl, 1]
            dims = [n, cb, h, w, vl]
        elif c == 1:  # the same value for every channel: plain memory, lanes stride 0
            buf = self.as_plain(name)
            strides = [h * w, 0, w, 1, 0]
            dims = [n, 1, h, w, 1]
        else:
            return None
        out5 = [out[0], bc.blocks(out[1], vl), out[2], out[3], vl]
        return buf, [0 if d == 1 and o != 1 else s for d, o, s in zip(dims, out5, strides)]

    def blocked_binary(self, node: Node, expr: str, emit_loop) -> bool:
        a, b = node.inputs
        y = node.outputs[0]
        out = self.shape(y)
        if len(out) != 4 or not (a in self.blocked or b in self.blocked):
            return False
        if not any(n in self.blocked and tuple(self.shape(n)) == tuple(out) for n in (a, b)):
            return False
        ra, rb = self.blocked_operand(a, out), self.blocked_operand(b, out)
        if ra is None or rb is None:
            return False
        dst = self.blocked_buffer(y)
        emit_loop(list(self.shape(dst)), ra[1], rb[1], ra[0], rb[0], dst, expr)
        self.finish_blocked_output(y)
        return True

    def blocked_sum(self, node: Node) -> bool:
        y = node.outputs[0]
        if len(self.shape(y)) != 4 or not any(n in self.blocked for n in node.inputs):
            return False
        srcs = [self.as_blocked(n) for n in node.inputs]
        dst = self.blocked_buffer(y)
        size = math.prod(self.shape(dst))
        terms = " + ".join(f"{self.ptr(s)}[i]" for s in srcs)
        self.step(f"for (int64_t i = 0; i < {size}; i++) {self.ptr(dst)}[i] = {terms};", srcs, [dst])
        self.finish_blocked_output(y)
        return True

    def concat_stays_blocked(self, node: Node) -> bool:
        """Whether a channel Concat with some inputs blocked is cheaper joined blocked: the
        elements reordered either way are weighed (the inputs not yet in the layout chosen,
        and the output when a convolution, which reads it blocked, consumes it). A decoder's
        or a split-and-join block's Concat, one input upsampled or sliced in NCHW and the
        others straight from convolutions, then reorders only the plain ones."""
        to_blocked = sum(math.prod(self.shape(n)) for n in node.inputs if n not in self.blocked)
        to_plain = sum(math.prod(self.shape(n)) for n in node.inputs
                       if n in self.blocked and n not in self.plain_ready)
        y = node.outputs[0]
        if any((user.domain, user.op_type) in CONV_OPS for user in self.consumers.get(y, [])):
            to_plain += math.prod(self.shape(y))
        return to_blocked <= to_plain

    def blocked_concat(self, node: Node) -> bool:
        y = node.outputs[0]
        out = self.shape(y)
        if len(out) != 4 or int(node.attrs.get("axis", 1)) % 4 != 1:
            return False
        if not self.concat_stays_blocked(node):
            return False
        inputs = self.concat_inputs(node, blocked=True)
        srcs = [self.as_blocked(n) for n in inputs]
        dst = self.blocked_buffer(y)
        slices = self.blocked_slices(y, inputs, srcs, dst)
        if slices:
            self.copy_slices(slices)
        else:
            support, code = bo.concat_channels([self.shape(n) for n in inputs], self.vl,
                                               [self.ptr(s) for s in srcs], self.ptr(dst))
            self.step(code, srcs, [dst], support=support)
        self.joined_as(node)
        self.finish_blocked_output(y)
        return True

    def blocked_slices(self, y: str, inputs: list[str], srcs: list[str], dst: str) -> list[Slice] | None:
        """One image's blocked Concat as ranges of its output, each input's buffer whole:
        every input starts on a block boundary and fills whole blocks (the last one may end
        in a partial block, as the output does). None otherwise (copied channel by channel)."""
        n, total, h, w = self.shape(y)
        if n != 1:  # an image's blocks are not contiguous with the next image's
            return None
        slices, channels = [], 0
        for x, src in zip(inputs, srcs):
            c = self.shape(x)[1]
            if channels % self.vl or (c % self.vl and channels + c != total):
                return None
            if c:
                slices.append(Slice(src, dst, channels * h * w, math.prod(self.shape(src))))
            channels += c
        return slices
