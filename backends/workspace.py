"""Large float32 buffers kept from one call to the next, so that their pages stay mapped.

A Piper sentence's HiFi-GAN writes three full-rate arrays per upsampling stage, the
last ones 5.6 MB each on a short sentence. Allocated afresh per call they cost about
2,000 page faults a sentence on the development VM (glibc hands the freed space back
to the system and maps it again: ``getrusage`` counted 2,030-2,095 minor faults per
short sentence, all of them in the generator): 2 ms of 67 at one thread, and more at
two, where both cores fault on one address space at once (the last transposed conv
took 5.8 ms at two threads against 3.4 at one). Buffers taken from a
:class:`Workspace` are the same pages every call (docs/performance.md, "Session 23").

A workspace belongs to one caller at a time (:meth:`Workspaces.taken`); what it hands
out has unspecified contents, as ``np.empty`` does, so no result depends on an earlier
call. It keeps at most :attr:`Workspaces.keep_bytes` a slot: a larger buffer is
allocated for that call and not kept, so what stays allocated is bounded per caller
decoding at the same time, for as long as the model that owns the workspaces is loaded.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


class Workspace:
    """Named float32 buffers, each grown to the largest request so far (up to a bound)."""

    def __init__(self, keep_bytes: int) -> None:
        self._keep = keep_bytes
        self._buffers: dict[str, np.ndarray] = {}

    @property
    def kept_bytes(self) -> int:
        """Bytes this workspace holds between calls."""
        return sum(b.nbytes for b in self._buffers.values())

    def take(self, slot: str, shape: tuple[int, ...]) -> np.ndarray:
        """A C-contiguous float32 array of ``shape`` (contents unspecified) in ``slot``'s
        buffer, grown to fit when it fits :attr:`keep_bytes`; else a new array, not kept.
        What ``slot`` gave before is overwritten: a caller takes each slot for one array
        at a time."""
        size = math.prod(shape)
        if 4 * size > self._keep:
            return np.empty(shape, np.float32)
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.size < size:
            buffer = self._buffers[slot] = np.empty(size, np.float32)
        return buffer[:size].reshape(shape)


class Workspaces:
    """A model's workspaces: one a caller that decodes now, kept for the next callers."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self._free: list[Workspace] = []
        self._lock = threading.Lock()
        self._made = 0

    @property
    def made(self) -> int:
        """Workspaces made so far: the most callers that held one at the same time."""
        return self._made

    @contextmanager
    def taken(self) -> Iterator[Workspace]:
        """A workspace no other caller holds until this block ends (the one freed last, whose
        buffers are likeliest still in cache; a new one when all are held)."""
        with self._lock:
            if self._free:
                work = self._free.pop()
            else:
                work = Workspace(self.keep_bytes)
                self._made += 1
        try:
            yield work
        finally:
            with self._lock:
                self._free.append(work)
