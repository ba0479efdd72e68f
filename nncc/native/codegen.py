"""C code for one partition: its nodes become one entry point ``int SYMBOL(void **args, char *ws)``.

``args`` holds a pointer per partition input, then per partition output (the planned
buffers the executor passes); ``ws`` is the partition's workspace, where intermediates
live at offsets planned here by liveness, with im2col columns as per-step scratch. Every
shape is a literal, so the C compiler specialises each step's loops. Reshape-like nodes
alias their input instead of copying, and a Conv whose only consumer is an Add (a residual
connection) writes through that Add and the activation after it in one epilogue pass.

Each step is a kernel, a C function of its buffers in its own translation unit, named by
the hash of its text: the same layer (op, shapes, attributes) in another model, partition
or compile is the same unit, built once into the kernel object cache. The step declares
its buffers (read or written, and their C types), scratch and BLAS use, and the kernel's
signature is built from that declaration (nncc/native/kernel.py). The entry point only
calls kernels over its arguments and workspace offsets.

``check(node, graph, infos)`` says why a node cannot be generated (None: it can). Which
nodes become C, and how, is decided per op by the entries of nncc/native/ops (the
registry): the writer here asks the entry that owns a node to check it and to write it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native import concat_slices, gemm_amx_gen, gemm_bf16_gen, gemm_gen, kernel
from nncc.native.precision import weights_pay
from nncc.native.activations import c_enum
from nncc.native.conv_gen import POOL_OPS, ConvSteps  # noqa: F401  (POOL_OPS: for callers listing ops)
from nncc.native.elementwise_gen import ALIASES, BINARY, UNARY, ElementwiseSteps  # noqa: F401  (as POOL_OPS)
from nncc.native.graph_query import is_pair_sum, source
from nncc.native.layout import BlockedLayout
from nncc.native.matmul_gen import MatmulSteps
from nncc.native.ops import registry
from nncc.native.arguments import index_argument
from nncc.native.ops.entry import static_f32
from nncc.plan.memory import aligned_empty

F32 = np.dtype(np.float32)
ALIGN = 64


def check(node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
    """None when the node can become C, else why not (nncc/native/ops/registry.py)."""
    return registry.node_refused(node, graph, infos)


@dataclass
class _Step:
    code: str
    reads: list[str]
    writes: list[str]
    buffers: list[tuple[str, str]]  # (root value, C type): the kernel's parameters, in order
    scratch: int = 0  # bytes of per-step workspace
    blas: bool = False  # calls the runtime's BLAS-backed helpers (nn_gemm, nn_conv2d)
    label: str = ""
    support: str = ""  # file-scope C the step's code calls (micro-kernels, parallel tasks)
    status: bool = False  # the step leaves an int64 in the first bytes of its scratch: not 0, the call fails
    guard: tuple[str, bool] | None = None  # (a bool scalar, its value): the step runs only then (an If's branch)
    slices: tuple = ()  # a Concat's copies (concat_slices.Slice), which ``finish`` may drop


@dataclass
class Unit:
    """One partition's C function and how to call it."""

    symbol: str
    source: str  # the entry point, calling its kernels
    args: list[str]  # value names: partition inputs, then outputs
    n_inputs: int
    workspace: int
    ops: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # one per step, for profiles
    kernels: list[kernel.Kernel] = field(default_factory=list)  # the distinct kernels its steps call
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # packed at compile time: inputs too
    blas: bool = False  # some step calls the BLAS numpy loaded (which must then keep to one thread)
    byte_images: dict[str, str] = field(default_factory=dict)  # quantized values int8 steps pass as bytes: layout
    # buffers living inside a Concat's output (nncc/native/concat_slices.py): (that output, offset in floats)
    placed: dict[str, tuple[str, int]] = field(default_factory=dict)
    low_attention: list[str] = field(default_factory=list)  # fused attentions (by output) computed in bfloat16


class _Writer(ConvSteps, MatmulSteps, ElementwiseSteps, BlockedLayout):
    """One partition's writer: names, shapes and packed constants, the dispatch of each
    node to the entry that owns it (nncc/native/ops), and ``finish`` (workspace offsets
    and the entry point). The steps the entries call live in the mixins: convolutions and
    pooling (conv_gen), MatMul and Gemm (matmul_gen), elementwise and data movement
    (elementwise_gen), the blocked layout (layout), and the generator modules."""

    def __init__(self, partition, graph: Graph, infos: dict[str, TensorInfo], symbol: str, vl: int = 4,
                 precision: str = "f32", profile_steps: bool = False, keep_f32: tuple[str, ...] = ()):
        self.graph, self.symbol = graph, symbol
        self.profile_steps = profile_steps  # time every step (generate's docstring)
        self.vl = vl  # floats per vector: the blocked layout's channel block (nncc/native/isa.py)
        if precision in ("bf16", "bf16amx") and vl != 16:
            raise ValueError("the bfloat16 GEMM needs AVX-512 (16 floats per vector)")
        # the arithmetic of the packed GEMM by constant weights, which gemm_gen's emitters read
        # (a product of two values computed at run time stays float32); on AMX the products
        # are vdpbf16ps's, so the other steps see "bf16"
        self.arithmetic = "bf16" if precision == "bf16amx" else precision
        self.low_packing = {"f32": gemm_gen.F32, "bf16": gemm_bf16_gen.BF16, "bf16w": gemm_bf16_gen.BF16W,
                            "bf16amx": gemm_amx_gen.AMX}[precision]
        self.packing = self.low_packing
        self.keep_f32 = frozenset(keep_f32)  # weights (by name) whose products stay float32 (precision auto)
        self.low_attention: list[str] = []  # attention_gen: the attentions multiplied in bfloat16, by output
        self.infos = dict(infos)  # plus the packed constants this partition adds
        self.nodes = list(partition.nodes)
        self.packed: dict[str, np.ndarray] = {}  # constants in the layout a kernel reads
        # compile-time constants the C code never reads (a Reshape's shape, Clip's bounds)
        # are not passed: every argument is a float32 tensor the code touches
        # an If's condition comes in as it is, one byte the entry point tests (``branch``)
        conditions = {n.inputs[0] for n in partition.nodes if n.op_type == "If" and not n.domain}
        read = [n for n in partition.inputs if static_f32(infos.get(n)) or index_argument(graph, infos, n)
                or n in conditions]
        self.args = read + list(partition.outputs)
        self.n_inputs = len(read)
        self.outputs = set(partition.outputs)
        self.alias: dict[str, str] = {}  # value -> the value whose memory it is
        self._ids: dict[str, int] = {}  # value -> the number in its C name (v_N)
        self.steps: list[_Step] = []
        consumers: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    consumers.setdefault(name, []).append(node)
        self.consumers = consumers
        self.deferred: dict[str, Node] = {}  # conv output -> conv node, written by its Add
        self.absorbed: set[int] = set()  # ids of activation nodes fused into a residual Add
        self.byte_images: dict[str, str] = {}  # quantized images stored as bytes: their layout (int8_bytes)
        self.guard: tuple[str, bool] | None = None  # the guard of the steps being written (``branch``)
        self.joined: dict[tuple, str] = {}  # (axis, inputs, guard) -> the Concat output joining them
        self.lent: dict[str, np.ndarray] = {}  # float32 constants of If branches: inputs when a step reads them
        self.init_layout()
        self.simd = source("simd.h") + "\n"

    # -- helpers ----------------------------------------------------------------------

    def shape(self, name):
        return self.infos[name].shape

    def root(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def ptr(self, name: str) -> str:
        """How a step's code names ``name``'s buffer: a marker its kernel binds to the
        parameter the step declares for it (nncc/native/kernel.py)."""
        return kernel.marker(self.index_of(self.root(name)))

    def _cname(self, name: str) -> str:
        return str(self.index_of(name))

    def index_of(self, name: str) -> int:
        return self._ids.setdefault(name, len(self._ids))

    def only_consumer(self, name: str) -> Node | None:
        users = self.consumers.get(name, [])
        if len(users) == 1 and name not in self.outputs:
            return users[0]
        return None

    def pack(self, source: str, form: str, array: np.ndarray) -> str:
        """A constant derived at compile time from ``source`` (weights in a kernel's
        layout): stored in the plan next to the original, which the portable plan keeps
        reading, and passed to the entry point as one more input."""
        name = f"{source}#{form}"
        if name not in self.packed:
            # on a 64-byte boundary, as the data cache maps it: a vector load that
            # straddles two cache lines costs the micro-kernels a third of their speed
            packed = aligned_empty(np.shape(array), F32)
            packed[...] = array
            self.packed[name] = packed
            self.infos[name] = TensorInfo(F32, tuple(self.packed[name].shape))
        return name

    # -- ops ----------------------------------------------------------------------------

    def build(self) -> Unit:
        for node in self.nodes:
            self.write(node)
        return self.finish()

    def write(self, node: Node) -> None:
        if id(node) in self.absorbed:
            return
        first = len(self.steps)
        self.packing = self.weights_packing(node)
        self.emit(node)
        for step in self.steps[first:]:
            step.label = step.label or f"{node.op_type} {node.name}"

    def weights_packing(self, node: Node):
        """The packing of ``node``'s product by constant weights (its second input), should
        it have one: float32 when precision auto kept that layer, or when its rows of A make
        widened bfloat16 weights cost more than they save (precision.weights_pay)."""
        weights = node.inputs[1] if len(node.inputs) > 1 else ""
        if self.low_packing is gemm_gen.F32 or weights in self.keep_f32:
            return gemm_gen.F32
        out = self.infos.get(node.outputs[0]) if node.outputs else None
        b = self.infos.get(weights)
        if out is None or b is None or not out.shape or not all(isinstance(d, int) for d in (*out.shape, *b.shape)):
            return self.low_packing
        rows = math.prod(out.shape[:-1]) // max(1, math.prod(b.shape[:-2]))  # per weight matrix
        return self.low_packing if weights_pay(self.arithmetic, rows) else gemm_gen.F32

    def branch(self, condition: str, taken: bool, branch, targets: list[str]) -> None:
        """The steps of one branch of an If (nncc/native/ops/conditional.py), run when the
        bool scalar ``condition`` is ``taken``; its outputs land in ``targets``, the If's.
        The layout state the branch changes is restored after it: a reorder of an outer
        value written under the guard has not run when the other branch or a later node
        needs it, so they write their own."""
        saved = dict(self.blocked), set(self.plain_ready), set(self.outputs)
        self.infos.update(branch.infos)
        self.graph = replace(self.graph, initializers={**self.graph.initializers, **branch.constants})
        self.lent.update((name, value) for name, value in branch.constants.items() if value.dtype == F32)
        for node in branch.nodes:
            for name in node.inputs:
                if name:
                    self.consumers.setdefault(name, []).append(node)
        produced = {o for node in branch.nodes for o in node.outputs if o}
        for out, target in zip(branch.outputs, targets):
            if out in produced:  # written in place of the If's output, plain (as a partition output is)
                self.alias[out] = target
                self.outputs.add(out)
        self.guard = (condition, taken)
        for node in branch.nodes:
            self.write(node)
        for out, target in zip(branch.outputs, targets):
            if self.root(out) != self.root(target):  # an outer value or a constant, or a view of one
                out = self.as_plain(out)
                size = math.prod(self.shape(target))
                self.step(f"memcpy({self.ptr(target)}, {self.ptr(out)}, {size} * sizeof(float));", [out], [target])
                self.steps[-1].label = f"If output {target}"
        self.guard = None
        self.blocked, self.plain_ready, self.outputs = saved

    def emit(self, node: Node) -> None:
        """Write ``node`` as the entry that accepted it in ``check`` says: in the blocked
        layout when it can keep it, else over plain inputs, unless a fusion claims it."""
        entry = registry.owner(node, self.graph, self.infos)
        if entry is None:  # the partitioner only places nodes check() accepted
            raise ValueError(f"no C generator for {node.op_type} {node.name!r}")
        if not entry.own_layout:
            residual = is_pair_sum(node) and any(i in self.deferred for i in node.inputs)
            blocked_input = any(i in self.blocked for i in node.inputs if i)
            if entry.blocked and blocked_input and not node.domain and not residual and \
                    entry.render_blocked(self, node):
                return
            if not residual:  # the convolution it completes reads its operands in their own layout
                self.plain_inputs(node)
            for fusion in registry.FUSIONS:
                claim = fusion.claim(self, node)
                if claim:
                    return fusion.render(self, node, claim)
        entry.render(self, node, entry.plan(self, node))

    def step(self, code: str, reads, writes, scratch: int = 0, support: str = "", blas: bool = False,
             status: bool = False) -> None:
        """One kernel: ``code`` over the buffers it declares. ``reads`` and ``writes`` hold
        value names, or (name, C type) for a buffer of another type than float32 (a table
        a struct describes); a buffer read defaults to ``const float *``, one written to
        ``float *``. ``scratch``: bytes the code reaches as ``scratch``; ``blas``: the code
        calls nn_gemm or nn_conv2d; ``status``: the code stores an int64 at the start of its
        scratch (which it asks for), and the entry point returns 1 when it is not 0 (an index
        out of range: the call fails as the portable kernel would)."""
        self.steps.append(self.make_step(code, reads, writes, scratch, support, blas, status, self.guard))

    def make_step(self, code: str, reads, writes, scratch: int = 0, support: str = "", blas: bool = False,
                  status: bool = False, guard=None) -> _Step:
        reads = [r if isinstance(r, tuple) else (r, kernel.READ) for r in reads if r]
        writes = [w if isinstance(w, tuple) else (w, kernel.WRITE) for w in writes if w]
        written = {self.root(name) for name, _ in writes}
        buffers: dict[str, str] = {}
        for name, ctype in reads + writes:
            root = self.root(name)
            if root not in buffers and (root not in written or (name, ctype) in writes):
                buffers[root] = ctype
        return _Step(code, [n for n, _ in reads], [n for n, _ in writes], list(buffers.items()),
                     scratch, blas, support=support, status=status, guard=guard)

    def copy_slices(self, slices: list[concat_slices.Slice]) -> None:
        """A Concat whose inputs are whole contiguous ranges of its output: one step of
        copies, each of which ``finish`` drops when the copied buffer can live in its range
        instead (nncc/native/concat_slices.py)."""
        self.steps.append(self.slices_step(slices, self.guard))

    def slices_step(self, slices, guard) -> _Step:
        support, code = concat_slices.copy_code(slices, self.ptr)
        made = self.make_step(code, [s.source for s in slices], [slices[0].target], support=support, guard=guard)
        made.slices = tuple(slices)
        return made

    def place_slices(self, args) -> dict[str, tuple[str, int]]:
        """Drop the Concat copies whose sources can live in their ranges instead; the
        steps left copy the rest (nncc/native/concat_slices.py)."""
        placed = concat_slices.place(self.steps, self.root, set(args), self.infos)
        steps = []
        for step in self.steps:
            kept = [s for s in step.slices if placed.get(self.root(s.source)) != (self.root(s.target), s.offset)]
            if len(kept) < len(step.slices):
                if not kept:
                    continue
                step = replace(self.slices_step(kept, step.guard), label=step.label)
            steps.append(step)
        self.steps = steps
        return placed

    # -- memory and text --------------------------------------------------------------

    def finish(self) -> Unit:
        if self.deferred:  # a deferred Conv whose Add was not emitted: cannot happen
            raise AssertionError("a residual Conv was never written")
        # an input no kernel takes (a weight every reader reads packed) is not an argument:
        # an exported library would otherwise carry it in its weights file for nothing
        taken = {root for step in self.steps for root, _ in step.buffers}
        taken |= {self.root(step.guard[0]) for step in self.steps if step.guard}
        self.packed.update((name, value) for name, value in self.lent.items() if name in taken)
        read = [name for name in self.args[:self.n_inputs] if name in taken]
        self.args = read + list(self.packed) + self.args[self.n_inputs:]
        self.n_inputs = len(read) + len(self.packed)
        args = {name: i for i, name in enumerate(self.args)}
        placed = self.place_slices(args)

        def buffer(name: str) -> str:  # the buffer holding a value's bytes: a Concat's output for a placed one
            return concat_slices.top(self.root(name), placed)[0]

        last_use: dict[str, int] = {}
        for index, step in enumerate(self.steps):
            for name in step.reads + step.writes + ([step.guard[0]] if step.guard else []):
                last_use[buffer(name)] = index
        offsets: dict[str, int] = {}
        live: list[tuple[int, int, int]] = []  # (offset, size, last step)
        scratch_at: dict[int, int] = {}
        size_total = 0

        def allocate(size: int, until: int, now: int) -> int:
            nonlocal live, size_total
            live = [blk for blk in live if blk[2] >= now]
            offset = 0
            for start, length, _ in sorted(live):
                if offset + size <= start:
                    break
                offset = max(offset, _align(start + length))
            live.append((offset, size, until))
            size_total = max(size_total, offset + size)
            return offset

        for index, step in enumerate(self.steps):
            for name in step.writes:
                root = buffer(name)
                if root not in args and root not in offsets:
                    # 4 bytes an element, 8 for an int64 (a Cast's: nncc/native/cast_gen.py)
                    width = max(4, getattr(self.infos[root].dtype, "itemsize", 4))
                    offsets[root] = allocate(math.prod(self.shape(root)) * width, last_use[root], index)
            if step.scratch:
                scratch_at[index] = allocate(step.scratch, index, index)
        kernels: dict[str, kernel.Kernel] = {}
        lines = []
        if self.profile_steps:
            lines.append(f"static int64_t {self.symbol}_ns[{len(self.steps)}];")
            lines.append(f"NN_EXPORT int {self.symbol}_profile(int64_t *out) {{ memcpy(out, {self.symbol}_ns, "
                         f"sizeof {self.symbol}_ns); return {len(self.steps)}; }}")
        lines.append(f"static int64_t {self.symbol}_work;  /* the last call's work (nn_call_begin) */")
        lines.append(f"NN_EXPORT int {self.symbol}(void **args, char *ws) {{")
        for name, i in args.items():
            lines.append(f"  float *v_{self._cname(name)} = (float *)args[{i}];")
        for name, offset in offsets.items():
            lines.append(f"  float *v_{self._cname(name)} = (float *)(ws + {offset});")
        for name in placed:  # inside a Concat's output, which lives in the workspace
            holder, at = concat_slices.top(name, placed)
            lines.append(f"  float *v_{self._cname(name)} = (float *)(ws + {offsets[holder] + 4 * at});")
        lines.append(f"  nn_call_begin(&{self.symbol}_work);")
        tested: dict[str, str] = {}  # condition -> the local holding it, read once before its first block
        guard = None
        for index, step in enumerate(self.steps):
            if step.guard != guard:
                lines.extend(self.guard_lines(guard, step.guard, tested))
                guard = step.guard
            made, pointers = self.make_kernel(step)
            kernels.setdefault(made.name, made)
            if made.scratch:
                pointers.append(f"ws + {scratch_at.get(index, 0)}")
            call = f"{made.name}({', '.join(pointers)});"
            if self.profile_steps:
                call = f"{{ int64_t t0 = nn_now(); {call} {self.symbol}_ns[{index}] += nn_now() - t0; }}"
            pad = "    " if step.guard else "  "  # inside an If's block
            lines.append(pad + call)
            if step.status:
                lines.append(f"{pad}if (*(const int64_t *)(ws + {scratch_at[index]})) {{ nn_call_end(&{self.symbol}_work); return 1; }}")
            # a scratch request that failed in the step (nn_scratch, prelude.h) fails the call
            lines.append(f"{pad}if (__atomic_load_n(&nn_scratch_short, __ATOMIC_RELAXED)) "
                         f"{{ nn_call_end(&{self.symbol}_work); return nn_scratch_failed({index}); }}")
        lines.extend(self.guard_lines(guard, None, tested))
        lines.append(f"  nn_call_end(&{self.symbol}_work);\n  return 0;\n}}\n")
        declarations = [k.declaration for k in kernels.values()]
        ops = sorted({n.op_type for n in self.nodes})
        return Unit(self.symbol, "\n".join(declarations + lines), self.args, self.n_inputs, _align(size_total),
                    ops, [s.label for s in self.steps], list(kernels.values()), dict(self.packed),
                    any(k.blas for k in kernels.values()), dict(self.byte_images), placed,
                    list(self.low_attention))

    def guard_lines(self, before, after, tested: dict[str, str]) -> list[str]:
        """C between a step guarded by ``before`` and one guarded by ``after`` (None: none).
        A condition is read into a local once, before its first block: a branch may reuse
        its workspace bytes, and the other branch is tested after it."""
        lines = ["  }"] if before is not None else []
        if after is not None:
            condition, taken = after
            if condition not in tested:
                tested[condition] = f"c_{len(tested)}"
                lines.append(f"  const int {tested[condition]} = *(const uint8_t *)v_{self._cname(self.root(condition))};")
            lines.append(f"  if ({'' if taken else '!'}{tested[condition]}) {{")
        return lines

    def make_kernel(self, step: _Step) -> tuple[kernel.Kernel, list[str]]:
        """The kernel a step declares, and the entry point's pointers to call it with."""
        body, params = kernel.bind(step.code, [(self.index_of(root), ctype) for root, ctype in step.buffers],
                                   step.label)
        # the entry point holds every buffer as float *: a buffer of another type is cast to it
        pointers = [("" if ctype in (kernel.READ, kernel.WRITE) else f"({ctype})") + f"v_{self._cname(root)}"
                    for root, ctype in step.buffers]
        return kernel.Kernel(params, body, step.support, step.scratch, step.blas), pointers


def generate(partition, graph: Graph, infos: dict[str, TensorInfo], symbol: str, vl: int = 4,
             precision: str = "f32", profile_steps: bool = False, keep_f32: tuple[str, ...] = ()) -> Unit:
    """``vl``: the floats per vector of the ISA the code is built for (nncc.native.isa);
    ``precision``: the arithmetic of the products by constant weights, "f32", "bf16" (which
    the ISA must have: nncc.native.precision.why_not_bf16), "bf16amx" (AMX tiles too:
    nncc.native.amx.usable) or "bf16w"; ``keep_f32``: the
    weights whose products stay float32 whatever it is. ``profile_steps``: a benchmark aid
    (benchmarks/step_classes.py) timing every step into a table the entry point
    ``SYMBOL_profile`` copies out; the compiler never asks for it, so such code is never
    cached or shipped."""
    return _Writer(partition, graph, infos, symbol, vl, precision, profile_steps, keep_f32).build()


def prelude() -> str:
    """The C every translation unit starts with: prelude.h, with the activation codes
    written in from their one table (nncc/native/activations.py)."""
    text = source("prelude.h")
    marker = next(line for line in text.splitlines() if line.startswith("NN_ACTIVATION_CODES"))
    return text.replace(marker, c_enum(), 1)


def translation_units(units: list[Unit]) -> list[tuple[str, str]]:
    """(label, C source) of every translation unit the partitions link from: the runtime,
    each distinct kernel, and one small unit of entry points per partition. Each starts
    with the prelude, so each compiles on its own."""
    head = prelude()
    out = [("runtime", head + "\n" + source("runtime.c"))]
    seen: set[str] = set()
    for unit in units:
        for made in unit.kernels:
            if made.name not in seen:
                seen.add(made.name)
                out.append((made.name, head + "\n" + made.definition))
    out.extend((unit.symbol, head + "\n" + unit.source) for unit in units)
    return out


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
