"""A Concat whose inputs are contiguous ranges of its output, written there by their
producers instead of copied.

For one image (the Concat's axis being the outermost one larger than 1), every input of
a channel Concat is one contiguous range of the output: in NCHW, and in the blocked
layout when the inputs are whole channel blocks. Such a Concat is written as a step of
``Slice`` copies; when the partition is finished, ``place`` decides which copies need not
run because the copied buffer can live inside the output instead (its producer then
writes its slice directly: a kernel only receives a pointer). A dense block's Concats,
each the previous one with one more layer's output, become prefixes of one buffer, and
joining costs nothing.

A source buffer is placed into its target's range only when nothing can tell:

- neither is a partition argument: an input or a constant is not written here, an
  output is the caller's buffer (which lives outside the workspace plan);
- the source is not placed already (a value in two Concats, or twice in one, is one
  range; the other copies stay);
- its bytes are exactly the range (float32, the whole buffer), which starts on a 64-byte
  boundary, as every workspace buffer does;
- exactly one step writes the source (its producer: a step writing it in place after
  that would change the Concat's output), as float32, before the copy; or, a Concat's
  output itself (a chain), only copy steps write it;
- only copy steps write the target: nothing writes the output over its inputs' bytes
  once they are in it;
- none of these steps is under an If's guard (the workspace of the two branches is
  shared, so a branch's layout is not planned across them).

A placed buffer then lives as long as the outermost buffer holding it (``top``), which is
allocated at the first write of any buffer inside it and kept until the last use of any.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nncc.native.kernel import WRITE

ALIGN = 64
_CHUNK = 1 << 15  # floats a copy task moves at most: a large slice is spread over the threads


@dataclass(frozen=True)
class Slice:
    source: str  # the buffer copied, whole
    target: str  # the Concat's output buffer
    offset: int  # floats from the target's start
    count: int  # floats (the source's size)


def copy_code(slices: list[Slice], ptr) -> tuple[str, str]:
    """(support, code) copying each slice's source into its range of the target: chunks
    of at most _CHUNK floats over the thread pool. ``ptr`` names a buffer (the writer's)."""
    sources = list(dict.fromkeys(s.source for s in slices))
    target = slices[0].target
    parts = []
    for s in slices:
        for start in range(0, s.count, _CHUNK):
            parts.append((sources.index(s.source), start, s.offset + start, min(_CHUNK, s.count - start)))
    table = ", ".join(f"{{{i}, {a}, {b}, {n}}}" for i, a, b, n in parts)
    k = len(sources)
    support = "\n".join([
        "static void slice_copy(void *p, int64_t lo, int64_t hi) {",
        "  const float *const *a = p;",
        f"  static const int64_t part[{len(parts)}][4] = {{{table}}};",
        "  for (int64_t t = lo; t < hi; t++)",
        f"    memcpy((float *)a[{k}] + part[t][2], a[part[t][0]] + part[t][1], (size_t)part[t][3] * sizeof(float));",
        "}",
        ""])
    pointers = [ptr(s) for s in sources] + [f"(const float *){ptr(target)}"]
    work = sum(s.count for s in slices)
    code = (f"{{ const float *a[{k + 1}] = {{{', '.join(pointers)}}}; "
            f"nn_parallel({len(parts)}, {work}, slice_copy, (void *)a); }}")
    return support, code


def place(steps, root, args, infos) -> dict[str, tuple[str, int]]:
    """The buffers to live inside a Concat's output: root -> (the target's root, offset
    in floats), by the rules above. ``steps``: the partition's steps in order, a copy
    step carrying its ``slices``; ``root``: a value's buffer; ``args``: the partition's
    arguments; ``infos``: dtype and shape of every buffer."""
    writers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in dict.fromkeys(root(w) for w in step.writes):
            writers.setdefault(name, []).append(index)
    copies = {index for index, step in enumerate(steps) if step.slices}

    def copied_only(name: str) -> bool:
        return all(i in copies and steps[i].guard is None for i in writers.get(name, []))

    def produced_once(name: str, before: int) -> bool:
        found = writers.get(name, [])
        if len(found) != 1 or found[0] >= before or found[0] in copies:
            return False
        step = steps[found[0]]
        return step.guard is None and dict(step.buffers).get(name) == WRITE

    placed: dict[str, tuple[str, int]] = {}
    for index, step in enumerate(steps):
        if index not in copies or step.guard is not None:
            continue
        for s in step.slices:
            source, target = root(s.source), root(s.target)
            info = infos[source]
            if source in args or target in args or source in placed or source == target:
                continue
            if np.dtype(info.dtype) != np.float32 or math.prod(info.shape) != s.count:
                continue
            if s.offset * 4 % ALIGN or not copied_only(target):
                continue
            if not (produced_once(source, index) or (copied_only(source) and writers.get(source))):
                continue
            placed[source] = (target, s.offset)
    return placed


def top(name: str, placed: dict[str, tuple[str, int]]) -> tuple[str, int]:
    """The outermost buffer holding ``name`` and its offset there, in floats."""
    offset = 0
    while name in placed:
        name, at = placed[name]
        offset += at
    return name, offset
