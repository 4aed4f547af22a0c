"""OpenCL program for :mod:`backends.opencl_backend`: built once per context, kernels per queue.

The OpenCL C source is ``kernels.cl`` next to this file. Building it is the slow
part (seconds on PoCL), so the built program is cached per context and shared by
every backend view (session) on that context. ``cl.Kernel`` objects are not
thread-safe (arguments are set on the object before each launch), so every view
creates its own from the shared program: see :class:`Kernels`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

SOURCE = (Path(__file__).with_name("kernels.cl")).read_text()

_I = np.int32
_F = np.float32
_B = None  # a buffer argument

# Scalar argument types of every kernel (None: buffer), for set_scalar_arg_dtypes.
_COPY = {
    "copy_block": [_B, _B, _I, _I, _I, _I, _I],
    "copy_nd": [_B, _B] + [_I] * 14,
    "pad": [_B, _B, _I, _I, _I, _I, _I, _I],
    "take": [_B, _B, _B, _I, _I, _I, _I],
}
SIGNATURES: dict[str, list[Any]] = {
    "unary_f": [_B, _B, _I, _F, _I],
    "binary_flat": [_B, _B, _B, _I, _I],
    "binary_2d": [_B, _B, _B] + [_I] * 6,
    "binary_nd": [_B, _B, _B] + [_I] * 22,
    "reduce_rows": [_B, _B, _I, _I],
    "reduce_strided": [_B, _B, _I, _I, _I, _I],
    "softmax_rows": [_B, _B, _I, _I],
    "softmax_strided": [_B, _B, _I, _I, _I, _I],
    "softmax_vec": [_B, _B, _I, _I, _I],
    "layer_norm_rows": [_B, _B, _B, _B, _I, _F, _I],
    "layer_norm_item": [_B, _B, _B, _B, _I, _F, _I, _I],
    "gemm": [_B, _B, _B, _B] + [_I] * 10 + [_F] + [_I] * 6,
    "gemm_direct": [_B, _B, _B, _B] + [_I] * 10 + [_F] + [_I] * 6,
    "gemm_block": [_B, _B, _B, _B] + [_I] * 10 + [_F] + [_I] * 6,
    "gemm_wide": [_B, _B, _B, _B] + [_I] * 10 + [_F] + [_I] * 6,
    "overlap_add": [_B, _B, _B] + [_I] * 9,
    "lstm_step": [_B, _B, _B, _B, _B, _I, _I, _I, _I],
    **{f"{name}_{size}": sig for name, sig in _COPY.items() for size in (4, 8)},
}

ROW_GROUP = 64
"""Work-group size of the row kernels (``RL`` in kernels.cl)."""

_programs: dict[int, cl.Program] = {}
_lock = threading.Lock()


def program(context: cl.Context) -> cl.Program:
    """The built program for ``context``: compiled on first use, then cached."""
    key = context.int_ptr
    with _lock:
        prg = _programs.get(key)
        if prg is None:
            prg = cl.Program(context, SOURCE).build()
            _programs[key] = prg
        return prg


class Kernels:
    """One set of ``cl.Kernel`` objects from a shared program, for one queue's thread."""

    def __init__(self, prg: cl.Program) -> None:
        self._prg = prg
        self._kernels: dict[str, cl.Kernel] = {}

    def __getitem__(self, name: str) -> cl.Kernel:
        knl = self._kernels.get(name)
        if knl is None:
            knl = cl.Kernel(self._prg, name)
            knl.set_scalar_arg_dtypes(SIGNATURES[name])
            self._kernels[name] = knl
        return knl
