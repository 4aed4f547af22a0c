"""Index bookkeeping of the OpenCL backend: sizes, strides, broadcasting, index collapsing.

The shape rules of the ops themselves (which operands agree, output lengths) are
shared by every backend in :mod:`backends.shapes`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

MAX_DIMS = 6
"""Dims of the index space of the strided kernels (copy_nd, binary_nd)."""


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)


def check_size(shape: Sequence[int]) -> None:
    if prod(shape) >= 2**31:
        raise ValueError(
            f"opencl: arrays of 2^31 elements or more are not supported ({tuple(shape)})"
        )


def need_float(*xs: Any) -> None:
    for x in xs:
        if x.dtype != np.float32:
            raise TypeError(f"opencl: this op takes float32 arrays, got {x.dtype}")


def split3(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    return prod(shape[:axis]), int(shape[axis]), prod(shape[axis + 1 :])


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Element strides of a C-contiguous array."""
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * int(shape[i + 1])
    return out


def broadcast_strides(shape: Sequence[int], target: Sequence[int]) -> list[int]:
    """Strides (elements) reading a contiguous ``shape`` array broadcast to ``target``."""
    pad = len(target) - len(shape)
    own = contiguous_strides(shape)
    return [0 if i < pad or shape[i - pad] == 1 else own[i - pad] for i in range(len(target))]


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous for every operand."""
    dims: list[int] = []
    sts: list[list[int]] = [[] for _ in strides]
    for i, d in enumerate(shape):
        if d == 1:
            continue
        if dims and all(s[-1] == st[i] * d for s, st in zip(sts, strides, strict=True)):
            dims[-1] *= d
            for s, st in zip(sts, strides, strict=True):
                s[-1] = st[i]
            continue
        dims.append(int(d))
        for s, st in zip(sts, strides, strict=True):
            s.append(int(st[i]))
    return dims, sts


def launches(
    dims: list[int], sts: list[list[int]]
) -> Iterator[tuple[list[int], list[list[int]], int, list[int]]]:
    """Launches of the six-dim strided kernels: (dims, strides per operand, out offset,
    operand offsets). Dims beyond six (rare alternating broadcasts) become host loops."""
    extra = len(dims) - MAX_DIMS
    if extra <= 0:
        fill = -extra
        yield [1] * fill + dims, [[0] * fill + s for s in sts], 0, [0] * len(sts)
        return
    inner = dims[extra:]
    size = prod(inner)
    for flat, idx in enumerate(np.ndindex(*dims[:extra])):
        offsets = [sum(i * st for i, st in zip(idx, s[:extra], strict=True)) for s in sts]
        yield inner, [s[extra:] for s in sts], flat * size, offsets
