"""The other kernels of the channel-blocked layout (see nncc/native/blocked_conv.py):
reorders between NCHW and the blocked layout at a partition's edges, pooling and global
average and max pooling vector by vector, and channel concatenation. Each returns (support C,
call statement) with every size a literal; pointers are C expressions the caller gives.
"""

from __future__ import annotations

from nncc.native.blocked_conv import after_store, blocks, stored


def _call(args: list[str], tasks: int, work: int, task: str) -> str:
    return (f"{{ const float *a[{len(args)}] = {{{', '.join(args)}}}; "
            f"nn_parallel({tasks}, {work}, {task}, (void *)a); }}")


def transpose_lines(vl: int, indent: str) -> list[str]:
    """C that transposes the vl x vl floats held in vectors r0..r{vl-1} in place (r_i[j]
    becomes r_j[i]): log2(vl) rounds of butterflies, each pair of vectors trading blocks of
    d lanes, all shuffles with literal lanes the compiler maps to the ISA's permutes."""
    lines = []
    d = 1
    while d < vl:
        for r in range(vl):
            if r & d:
                continue
            lo = ", ".join(str(j if not j & d else vl + j - d) for j in range(vl))
            hi = ", ".join(str(j + d if not j & d else vl + j) for j in range(vl))
            lines.append(f"{indent}{{ const nn_v t0 = __builtin_shufflevector(r{r}, r{r + d}, {lo}), "
                         f"t1 = __builtin_shufflevector(r{r}, r{r + d}, {hi}); r{r} = t0; r{r + d} = t1; }}")
        d *= 2
    return lines


def to_blocked(shape, vl: int, x: str, y: str, channels: list[int] | None = None) -> tuple[str, str]:
    """NCHW -> blocked; the padding lanes of the last block are written as zeros. A whole
    block moves vl pixels at a time: vl channel rows loaded, transposed in registers, stored
    as vl pixel vectors. ``channels``: the input channel each output channel is read from (a
    channel shuffle folded into the reorder), else the same one."""
    n, c, h, w = shape
    table = ""
    if channels is None:
        def plane(ch: str) -> str:
            return f"(n * {c} + {ch}) * {h * w}"
        rows = f"const float *xc = x + {plane(f'cb * {vl}')};"
        loads = "".join(f"r{l} = nn_vload(xc + {l * h * w} + i), " for l in range(vl))[:-2]
    else:
        assert sorted(channels) == list(range(c)), "a permutation of the channels"
        table = f"static const int32_t source_channel[{c}] = {{{', '.join(map(str, channels))}}};\n"

        def plane(ch: str) -> str:
            return f"(n * {c} + source_channel[{ch}]) * {h * w}"
        rows = " ".join(f"const float *x{l} = x + {plane(f'cb * {vl} + {l}')};" for l in range(vl))
        loads = "".join(f"r{l} = nn_vload(x{l} + i), " for l in range(vl))[:-2]
    stores = " ".join(f"nn_vstore(yb + (i + {p}) * {vl}, r{p});" for p in range(vl))
    vector = "\n".join(["#ifdef NN_SHUFFLE", f"      for (; i + {vl} <= i1; i += {vl}) {{", f"        nn_v {loads};",
                         *transpose_lines(vl, "        "), f"        {stores}", "      }", "#endif"])
    support, call = _reorder(shape, vl, x, y, f"""
    int64_t i = i0;
    if (cb * {vl} + {vl} <= {c}) {{
      {rows}
{vector}
    }}
    for (int l = 0; l < {vl}; l++) {{
      const int64_t ch = cb * {vl} + l;
      if (ch < {c}) {{
        const float *xc = x + {plane('ch')};
        for (int64_t k = i; k < i1; k++) yb[k * {vl} + l] = xc[k];
      }} else {{
        for (int64_t k = i; k < i1; k++) yb[k * {vl} + l] = 0.0f;
      }}
    }}""", out_blocked=True)
    return table + support, call


def to_plain(shape, vl: int, x: str, y: str) -> tuple[str, str]:
    """blocked -> NCHW (the padding lanes are dropped). A whole block moves vl pixels at a
    time: vl pixel vectors loaded, transposed in registers, stored into vl channel rows."""
    n, c, h, w = shape
    loads = "".join(f"r{p} = nn_vload(xb + (i + {p}) * {vl}), " for p in range(vl))[:-2]
    stores = " ".join(f"nn_vstore(yc + {l * h * w} + i, r{l});" for l in range(vl))
    vector = "\n".join(["#ifdef NN_SHUFFLE", f"      for (; i + {vl} <= i1; i += {vl}) {{", f"        nn_v {loads};",
                         *transpose_lines(vl, "        "), f"        {stores}", "      }", "#endif"])
    return _reorder(shape, vl, x, y, f"""
    int64_t i = i0;
    if (cb * {vl} + {vl} <= {c}) {{
      float *yc = y + (n * {c} + cb * {vl}) * {h * w};
{vector}
    }}
    for (int l = 0; l < {vl} && cb * {vl} + l < {c}; l++) {{
      float *yc = y + (n * {c} + cb * {vl} + l) * {h * w};
      for (int64_t k = i; k < i1; k++) yc[k] = xb[k * {vl} + l];
    }}""", out_blocked=False)


# Pixels a reorder moves lane by lane before the next ones: a block of a large plane (128 x
# 128 x 8 floats, 512 KiB) outgrows the cache, and a pass per lane over all of it read or
# wrote each of its lines once per lane; a run of 64 pixels (2 KiB of the block) stays in L1
# across its lanes.
REORDER_PIXELS = 64


def _reorder(shape, vl: int, x: str, y: str, body: str, out_blocked: bool) -> tuple[str, str]:
    """A reorder task per (image, channel block): ``body`` moves the pixels [i0, i1) of
    block ``cb`` of image ``n`` between x and y, with ``xb`` or ``yb`` the block's start on
    the blocked side, one run of REORDER_PIXELS after another."""
    n, c, h, w = shape
    cb, hw = blocks(c, vl), h * w
    side = (f"float *yb = y + t * {hw * vl};" if out_blocked else f"const float *xb = x + t * {hw * vl};")
    support = f"""NN_REQUIRE_VL({vl});
static void reorder_task(void *p, int64_t lo, int64_t hi) {{
  const float *const *a = p;
  const float *x = a[0];
  float *y = (float *)a[1];
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t n = t / {cb}, cb = t % {cb};
    {side}
    for (int64_t i0 = 0; i0 < {hw}; i0 += {REORDER_PIXELS}) {{
    const int64_t i1 = i0 + {REORDER_PIXELS} < {hw} ? i0 + {REORDER_PIXELS} : {hw};{body}
    }}
  }}
}}
"""
    return support, _call([x, f"(const float *){y}"], n * cb, n * cb * hw * vl, "reorder_task")


def pool(kind: str, shape, out_hw, kernel, strides, pads, dilations, include_pad: bool, vl: int,
         x: str, y: str) -> tuple[str, str]:
    """MaxPool ("max", NaN propagates) or AveragePool ("avg") of a blocked tensor."""
    n, c, h, w = shape
    oh, ow = out_hw
    kh, kw = kernel
    sh, sw = strides
    pt, pl, pb, pr = pads
    dh, dw = dilations
    cb = blocks(c, vl)
    if kind == "max":
        init, tap, finish = "nn_vset1(-INFINITY)", "acc = nn_vmaxnan(acc, nn_vload(xi + iw * {vl}));", "acc"
    else:
        init, tap = "nn_vzero()", "acc = nn_vadd(acc, nn_vload(xi + iw * {vl}));"
        finish = "nn_vmul(acc, nn_vset1(count ? 1.0f / (float)count : 0.0f))"
    tap = tap.format(vl=vl)
    # rows/columns a window covers: inside the input (taps) and inside the padded input
    # (what count_include_pad counts; ceil_mode windows may reach beyond both)
    count = ("(int64_t)(pr1 - pr0) * (pc1 - pc0)" if include_pad else "(int64_t)(i1 - i0) * (j1 - j0)")
    support = f"""
static void pool_task(void *p, int64_t lo, int64_t hi) {{
  const float *const *a = p;
  const float *xp = a[0];
  float *yp = (float *)a[1];
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t oh = t % {oh}, nc = t / {oh};
    const float *x = xp + nc * {h * w * vl};
    float *y = yp + (nc * {oh} + oh) * {ow * vl};
    const int64_t ih0 = oh * {sh} - {pt};
    int64_t i0 = ih0 >= 0 ? 0 : (-ih0 + {dh - 1}) / {dh};
    int64_t i1 = ih0 + {(kh - 1) * dh} < {h} ? {kh} : ({h - 1} - ih0 >= 0 ? ({h - 1} - ih0) / {dh} + 1 : 0);
    if (i1 < i0) i1 = i0;
    int64_t pr0 = ih0 < -{pt} ? -{pt} : ih0, pr1 = ih0 + {(kh - 1) * dh + 1};
    if (pr1 > {h + pb}) pr1 = {h + pb};
    for (int64_t ow = 0; ow < {ow}; ow++) {{
      const int64_t iw0 = ow * {sw} - {pl};
      int64_t j0 = iw0 >= 0 ? 0 : (-iw0 + {dw - 1}) / {dw};
      int64_t j1 = iw0 + {(kw - 1) * dw} < {w} ? {kw} : ({w - 1} - iw0 >= 0 ? ({w - 1} - iw0) / {dw} + 1 : 0);
      if (j1 < j0) j1 = j0;
      int64_t pc0 = iw0 < -{pl} ? -{pl} : iw0, pc1 = iw0 + {(kw - 1) * dw + 1};
      if (pc1 > {w + pr}) pc1 = {w + pr};
      nn_v acc = {init};
      for (int64_t i = i0; i < i1; i++) {{
        const float *xi = x + (ih0 + i * {dh}) * {w * vl};
        for (int64_t j = j0; j < j1; j++) {{
          const int64_t iw = iw0 + j * {dw};
          {tap}
        }}
      }}
      const int64_t count = {count};
      (void)count; (void)pr0; (void)pr1; (void)pc0; (void)pc1;
      nn_vstore(y + ow * {vl}, {finish});
    }}
  }}
}}
"""
    return f"NN_REQUIRE_VL({vl});\n" + support, _call([x, f"(const float *){y}"], n * cb * oh,
                                                      n * cb * oh * ow * kh * kw * vl, "pool_task")


def global_average(shape, vl: int, x: str, y: str) -> tuple[str, str]:
    """[N, C, H, W] blocked -> [N, C, 1, 1] blocked: the mean of each channel."""
    n, c, h, w = shape
    cb, hw = blocks(c, vl), h * w
    support = f"""NN_REQUIRE_VL({vl});
static void gap_task(void *p, int64_t lo, int64_t hi) {{
  const float *const *a = p;
  const float *xp = a[0];
  float *yp = (float *)a[1];
  for (int64_t t = lo; t < hi; t++) {{
    const float *x = xp + t * {hw * vl};
    nn_v s0 = nn_vzero(), s1 = nn_vzero(), s2 = nn_vzero(), s3 = nn_vzero();
    int64_t i = 0;
    for (; i + 4 <= {hw}; i += 4) {{
      s0 = nn_vadd(s0, nn_vload(x + i * {vl}));
      s1 = nn_vadd(s1, nn_vload(x + (i + 1) * {vl}));
      s2 = nn_vadd(s2, nn_vload(x + (i + 2) * {vl}));
      s3 = nn_vadd(s3, nn_vload(x + (i + 3) * {vl}));
    }}
    for (; i < {hw}; i++) s0 = nn_vadd(s0, nn_vload(x + i * {vl}));
    nn_vstore(yp + t * {vl}, nn_vmul(nn_vadd(nn_vadd(s0, s1), nn_vadd(s2, s3)), nn_vset1({1.0 / hw!r}f)));
  }}
}}
"""
    return support, _call([x, f"(const float *){y}"], n * cb, n * cb * hw * vl, "gap_task")


def global_max(shape, vl: int, x: str, y: str) -> tuple[str, str]:
    """[N, C, H, W] blocked -> [N, C, 1, 1] blocked: the largest value of each channel, a NaN
    anywhere in it giving NaN (the padding lanes hold zeros: their result is never read)."""
    n, c, h, w = shape
    cb, hw = blocks(c, vl), h * w
    support = f"""NN_REQUIRE_VL({vl});
static void gmp_task(void *p, int64_t lo, int64_t hi) {{
  const float *const *a = p;
  const float *xp = a[0];
  float *yp = (float *)a[1];
  for (int64_t t = lo; t < hi; t++) {{
    const float *x = xp + t * {hw * vl};
    nn_v m0 = nn_vset1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 4 <= {hw}; i += 4) {{
      m0 = nn_vmaxnan(m0, nn_vload(x + i * {vl}));
      m1 = nn_vmaxnan(m1, nn_vload(x + (i + 1) * {vl}));
      m2 = nn_vmaxnan(m2, nn_vload(x + (i + 2) * {vl}));
      m3 = nn_vmaxnan(m3, nn_vload(x + (i + 3) * {vl}));
    }}
    for (; i < {hw}; i++) m0 = nn_vmaxnan(m0, nn_vload(x + i * {vl}));
    nn_vstore(yp + t * {vl}, nn_vmaxnan(nn_vmaxnan(m0, m1), nn_vmaxnan(m2, m3)));
  }}
}}
"""
    return support, _call([x, f"(const float *){y}"], n * cb, n * cb * hw * vl, "gmp_task")


def concat_channels(shapes, vl: int, xs: list[str], y: str) -> tuple[str, str]:
    """Blocked inputs [N, C_i, H, W] -> blocked [N, sum C_i, H, W], a task per (image,
    input): whole blocks are copied at once when an input starts on a block boundary and
    fills whole blocks (or ends the output); otherwise channel by channel."""
    n, _, h, w = shapes[0]
    hw = h * w
    total = sum(s[1] for s in shapes)
    out_cb = blocks(total, vl)
    cases = []
    offset = 0
    for i, shape in enumerate(shapes):
        c = shape[1]
        in_cb = blocks(c, vl)
        lines = [f"      case {i}: {{"]
        if offset % vl == 0 and (c % vl == 0 or offset + c == total):
            lines.append(f"        memcpy(y + (n * {out_cb} + {offset // vl}) * {hw * vl}, x[{i}] + n * {in_cb * hw * vl}, "
                         f"{in_cb * hw * vl} * sizeof(float));")
        else:
            lines += [f"        for (int64_t ch = 0; ch < {c}; ch++) {{",
                      f"          const float *src = x[{i}] + (n * {in_cb} + ch / {vl}) * {hw * vl} + ch % {vl};",
                      f"          float *dst = y + (n * {out_cb} + (ch + {offset}) / {vl}) * {hw * vl} + (ch + {offset}) % {vl};",
                      f"          for (int64_t i = 0; i < {hw}; i++) dst[i * {vl}] = src[i * {vl}];",
                      "        }"]
        lines += ["        break;", "      }"]
        cases += lines
        offset += c
    k = len(shapes)
    support = "\n".join([
        "static void concat_task(void *p, int64_t lo, int64_t hi) {",
        "  const float *const *x = p;",
        f"  float *y = (float *)x[{k}];",
        "  for (int64_t t = lo; t < hi; t++) {",
        f"    const int64_t n = t / {k};",
        f"    switch (t % {k}) {{",
        *cases,
        "    }",
        "  }",
        "}",
        ""])
    return support, _call([*xs, f"(const float *){y}"], n * k, n * out_cb * vl * hw, "concat_task")


def scale_shift(shape, vl: int, x: str, scale: str, shift: str, y: str, act: int, p0: str,
                p1: str) -> tuple[str, str]:
    """y = act(x * scale[c] + shift[c]) over a blocked [N, C, H, W] (scale, shift packed to
    whole blocks): one vector multiply-add per pixel."""
    n, c, h, w = shape
    cb, hw = blocks(c, vl), h * w
    vact = stored("v", None, act, p0, p1)
    scalar = after_store(act, "yb", hw, vl, p0, p1)
    support = f"""NN_REQUIRE_VL({vl});
static void affine_task(void *p, int64_t lo, int64_t hi) {{
  const float *const *a = p;
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t cb = t % {cb};
    const nn_v s = nn_vload(a[1] + cb * {vl}), b = nn_vload(a[2] + cb * {vl});
    const float *xb = a[0] + t * {hw * vl};
    float *yb = (float *)a[3] + t * {hw * vl};
    for (int64_t i = 0; i < {hw}; i++) {{
      nn_v v = nn_vfma(nn_vload(xb + i * {vl}), s, b);
      nn_vstore(yb + i * {vl}, {vact});
    }}
    {scalar}
  }}
}}
"""
    return support, _call([x, scale, shift, f"(const float *){y}"], n * cb, n * cb * hw * vl, "affine_task")
