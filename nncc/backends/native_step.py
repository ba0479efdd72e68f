"""A native partition as one executor step: a call into verified, loaded C code.

The step looks like a kernel that writes into planned outputs: ``step(ctx, *inputs,
out=outputs)``. Its pointer table is rebuilt only for arguments whose array changed since
the last run (constants and arena buffers are the same objects every run), so a call costs
a few identity checks plus the C function itself, which runs without the GIL. A fresh array
(a caller's output, allocated every run) gives its address through ``ctypes.from_buffer``,
which also checks that it is dense and writable, at a quarter of ``array.ctypes.data``'s cost.

Code built in the sanitize mode gets, on every call, each argument and the workspace in a
heap block of its own, exactly its size, from the process's malloc (AddressSanitizer's):
inputs copied in, outputs copied out. A read or write past a tensor's end then lands in
ASan's redzone instead of a neighbour in the arena or a numpy allocation's slack. Output
blocks and the workspace start filled with NaN, so an element the code never writes shows
in the result.
"""

from __future__ import annotations

import ctypes
from operator import is_

import numpy as np

from nncc.errors import IndexRangeError, KernelError, NnccError
from nncc.native.loader import SCRATCH_STATUS
from nncc.util.limits import LimitError
from nncc.util.threads import one_blas_thread
from nncc.plan.memory import aligned_empty


class NativeStep:
    __slots__ = ("fn", "call", "table", "held", "copies", "workspace", "workspace_address", "label", "pooled",
                 "sanitized", "input_types", "scratch_failure", "__weakref__")

    def __init__(self, fn, call, label: str, pooled: bool = False, sanitized: bool = False, input_types=None,
                 scratch_failure=None):
        """``call``: the nncc.backends.native.NativeCall it makes. ``pooled``: the code runs its GEMMs on its own thread pool, so BLAS keeps to one
        thread during the call (its idle workers would spin against the pool's).
        ``sanitized``: the code was built in the sanitize mode (see the module's docstring).
        ``input_types``: each input's dtype in the plan (float32 unless given; a Gather's
        indices are int32 or int64), which its buffer is made dense in. ``scratch_failure``:
        the library's record of a call that ran out of scratch memory (Library.scratch_failure)."""
        self.fn = fn
        self.pooled = pooled
        self.sanitized = sanitized
        self.call = call
        self.table = (ctypes.c_void_p * len(call.args))()
        self.held: list = [None] * len(call.args)  # the array each pointer was taken from
        self.copies: list = [None] * len(call.args)  # dense copies of inputs that were views
        self.workspace = aligned_empty((max(call.workspace, 64),), np.uint8)
        self.workspace_address = self.workspace.ctypes.data  # owned by the step: it never moves
        self.label = label
        self.input_types = [np.dtype(t) for t in input_types] if input_types else \
            [np.dtype(np.float32)] * call.n_inputs
        self.scratch_failure = scratch_failure

    def __call__(self, ctx, *inputs, out):
        if self.sanitized:
            return self._call_fenced(inputs, out)
        held = self.held
        if not all(map(is_, inputs, held)):  # one C-level pass: constants and reused feeds match
            for i, array in enumerate(inputs):
                if array is not held[i]:
                    self._hold_input(i, array)
        return self._call_into(out)

    def call_fed(self, fed, feeds, out):
        """__call__ for a program of this one call whose constants were bound
        (bind_constants): ``fed``, (argument index, feed name) of each argument taken from
        ``feeds``; only those are compared with what the table holds. None in the sanitize
        mode, which copies every argument on each call: the caller then calls as usual."""
        if self.sanitized:
            return None
        held = self.held
        for i, name in fed:
            array = feeds[name]
            if array is not held[i]:
                self._hold_input(i, array)
        return self._call_into(out)

    def _hold_input(self, i: int, array) -> None:
        self.table[i] = self._input_pointer(array, i)
        # a copy holds this run's values only: the same view fed again is copied again
        self.held[i] = array if self.copies[i] is array else None

    def _call_into(self, out):
        """The call, its inputs' pointers in the table, writing ``out`` (a graph output is a
        fresh array every run: its pointer taken when it is not the one held)."""
        table, held, base = self.table, self.held, self.call.n_inputs
        for j, array in enumerate(out):
            if array is not held[base + j]:
                table[base + j] = self._output_pointer(array, j)
                held[base + j] = array
        if self.pooled:
            with one_blas_thread(True):
                status = self.fn(table, self.workspace_address)
        else:
            status = self.fn(table, self.workspace_address)
        if status != 0:
            raise self._failure(status)
        return out

    def bind_constants(self, constants: dict) -> None:
        """Take the addresses of the inputs that are the same array every run (input index
        -> array) before the first run, which then finds them held as a later run does."""
        if self.sanitized:
            return  # a fenced call copies every input into a block of its own each run
        for index, array in constants.items():
            self.table[index] = self._input_pointer(array, index)
            self.held[index] = array

    def bind_outputs(self, outputs) -> None:
        """Take the addresses of the arrays the next run writes its outputs into (the
        first run's, allocated with the executor), which it then finds held."""
        if self.sanitized:
            return
        base = self.call.n_inputs
        for j, array in enumerate(outputs):
            self.table[base + j] = self._output_pointer(array, j)
            self.held[base + j] = array

    def _output_pointer(self, array, index: int) -> int:
        dense = array.dtype is _FLOAT32 or array.dtype == _FLOAT32
        if dense and array.size:
            try:
                return _address(_view(array))  # refuses a strided or read-only array
            except (TypeError, ValueError):
                dense = False
        if not dense or not array.flags.c_contiguous or not array.flags.writeable:
            raise AssertionError(f"{self.label}: output buffer {index} is not dense float32")
        return array.ctypes.data  # empty: no memory to view

    def _input_pointer(self, array, index: int) -> int:
        if array.dtype != self.input_types[index] or not array.flags.c_contiguous:
            # the generated code reads dense values of the input's type; a strided view from
            # a portable kernel or a caller, or a broadcast constant, is copied (a constant
            # once, bind_constants: it is the same every run; anything else on every run)
            array = np.ascontiguousarray(array, dtype=self.input_types[index])
        self.copies[index] = array
        if array.flags.writeable and array.size:
            return _address(_view(array))
        return array.ctypes.data  # read-only (a memory-mapped feed): the slower way

    def _call_fenced(self, inputs, out):
        """One call with every buffer in its own exactly-sized heap block."""
        for j, array in enumerate(out):
            if array.dtype != np.float32 or not array.flags.c_contiguous or not array.flags.writeable:
                raise AssertionError(f"{self.label}: output buffer {j} is not dense float32")
        blocks = []
        try:
            table = (ctypes.c_void_p * len(self.call.args))()
            for i, array in enumerate(inputs):
                dense = np.ascontiguousarray(array, dtype=self.input_types[i])
                table[i] = _block(blocks, dense.nbytes)
                ctypes.memmove(table[i], dense.ctypes.data, dense.nbytes)
            base = len(inputs)
            for j, array in enumerate(out):
                table[base + j] = _block(blocks, array.nbytes, fill=0xFF)
            workspace = _block(blocks, self.call.workspace, fill=0xFF)
            with one_blas_thread(self.pooled):
                status = self.fn(table, workspace)
            if status != 0:
                raise self._failure(status)
            for j, array in enumerate(out):
                ctypes.memmove(array.ctypes.data, table[base + j], array.nbytes)
        finally:
            for block in blocks:
                _LIBC.free(block)
        return out


    def _failure(self, status: int) -> NnccError:
        """Why a native call returned ``status``: 1, a step found an index outside its axis
        (a Gather's id outside its table), which is the feeds' fault, not the code's;
        SCRATCH_STATUS, a step's scratch could not be allocated (memory ran out)."""
        if status == 1:
            return IndexRangeError(f"native partition {self.label}: an index out of range (a Gather id outside its axis)")
        if status == SCRATCH_STATUS and self.scratch_failure is not None:
            nbytes, step = self.scratch_failure()
            # the executor puts the partition's label in front
            return LimitError(f"native step {step} could not allocate {nbytes:,} bytes of scratch memory",
                              hint="free memory, or raise the process's memory limit (ulimit -v)")
        return KernelError(f"native partition {self.label} failed: status {status}")


_FLOAT32 = np.dtype(np.float32)
_view = ctypes.c_char.from_buffer  # a ctypes object over an array's memory (dense and writable only)
_address = ctypes.addressof

_LIBC = ctypes.CDLL(None)  # the process's malloc: AddressSanitizer's, when its runtime was preloaded
_LIBC.malloc.restype = ctypes.c_void_p
_LIBC.malloc.argtypes = [ctypes.c_size_t]
_LIBC.free.argtypes = [ctypes.c_void_p]


def _block(blocks: list, size: int, fill: int | None = None) -> int:
    """A heap block of exactly ``size`` bytes (0xFF bytes are float NaN), kept in ``blocks``."""
    address = _LIBC.malloc(size)
    if address is None:
        raise MemoryError(f"cannot allocate {size} bytes for a native call")
    blocks.append(address)
    if fill is not None and size:
        ctypes.memset(address, fill, size)
    return address
