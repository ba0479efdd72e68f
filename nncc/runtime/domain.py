"""Executor-managed buffers with roles, after NNAPI's memory domains: buffers the executor
owns, usable only in the roles they were allocated for.

A DomainBuffer is allocated by a compiled model for a declared set of roles, each
("input", name) or ("output", name) of that same model. The executor checks every use
against those roles before any kernel runs. A buffer that is both read and written in one
run (a recurrent state: output h_out of step k is input h_in of step k+1) is double
buffered: the run writes into a second array and the two swap afterwards, so a step
never reads memory it is overwriting and no copy is made.
"""

from __future__ import annotations

import threading

import numpy as np

from nncc.errors import InputError

ROLE_KINDS = ("input", "output")


class DomainBuffer:
    def __init__(self, owner: object, roles: list[tuple[str, str]], dtype: np.dtype,
                 shape: tuple | None):
        self._owner = owner
        self.roles = frozenset(roles)
        self.dtype = np.dtype(dtype)
        self._lock = threading.Lock()
        self._array: np.ndarray | None = None
        self._shadow: np.ndarray | None = None
        if shape is not None and all(isinstance(d, int) for d in shape):
            self._array = np.zeros(shape, self.dtype)

    @property
    def shape(self) -> tuple | None:
        array = self._array
        return None if array is None else tuple(array.shape)

    def allows(self, owner: object, kind: str, name: str) -> bool:
        return owner is self._owner and (kind, name) in self.roles

    def copy_from(self, array) -> None:
        """Initialize or overwrite the contents (the shape is fixed by the first copy or
        output when the roles left dimensions unknown)."""
        array = np.asarray(array)
        if array.dtype != self.dtype:
            raise InputError(f"buffer holds {self.dtype}, cannot copy from {array.dtype}")
        with self._lock:
            if self._array is None:
                self._array = np.array(array, dtype=self.dtype, order="C")
                return
            if array.shape != self._array.shape:
                raise InputError(f"buffer has shape {list(self._array.shape)}, cannot copy from {list(array.shape)}")
            np.copyto(self._array, array)

    def copy_to(self, array: np.ndarray | None = None) -> np.ndarray:
        """The contents, copied into ``array`` (or a new array)."""
        current = self._array
        if current is None:
            raise InputError("buffer has no contents yet (nothing was written into it)")
        if array is None:
            return current.copy()
        if array.shape != current.shape or array.dtype != current.dtype:
            raise InputError(f"cannot copy a {current.dtype}{list(current.shape)} buffer into "
                             f"a {array.dtype}{list(array.shape)} array")
        np.copyto(array, current)
        return array

    # -- used by the executor ---------------------------------------------------------------

    def current(self) -> np.ndarray | None:
        return self._array

    def target(self, shape: tuple, also_read: bool) -> np.ndarray:
        """The array a run writes into: the current one, or (when the same run reads the
        buffer) the second one, swapped in by ``commit``."""
        with self._lock:
            if self._array is None:
                self._array = np.zeros(shape, self.dtype)
            if tuple(self._array.shape) != tuple(shape):
                raise InputError(f"buffer has shape {list(self._array.shape)}, but the output is {list(shape)}")
            if not also_read:
                return self._array
            if self._shadow is None or self._shadow.shape != self._array.shape:
                self._shadow = np.empty_like(self._array)
            return self._shadow

    def commit(self, written: np.ndarray) -> None:
        with self._lock:
            if written is self._shadow:
                self._array, self._shadow = self._shadow, self._array
