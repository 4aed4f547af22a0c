"""Shape rules of the array ops, shared by every backend and by model code.

One place for each rule: the output length of a (transposed) convolution, and
the shape checks of the ops whose operands must agree (matmul, linear, conv1d,
conv_transpose1d, attention, layer norm, LSTM, concat, write_slice, reshape,
broadcasting). Every backend calls these before (or, for the cheap elementwise
ops, after a failed) computation, so a bad shape raises :class:`ShapeError`,
a ``ValueError`` naming the op and the shapes, the same on numpy, cupy and
OpenCL. The checks take shapes (tuples of ints), never arrays; a backend reads an
optional operand's shape with :func:`shape_of`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

Shape = Sequence[int]


class ShapeError(ValueError):
    """Operands whose shapes the op cannot take; the message names the op and the shapes."""


def shape_of(x: Any) -> tuple[int, ...] | None:
    """The shape of an optional operand (a bias, gamma, beta, a mask): None when absent."""
    return None if x is None else tuple(x.shape)


def conv1d_length(
    length: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1
) -> int:
    """Output length of a 1-D convolution (torch's formula; <= 0 means no output)."""
    return (length + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv_transpose1d_length(
    length: int,
    kernel: int,
    stride: int = 1,
    padding: int = 0,
    output_padding: int = 0,
    dilation: int = 1,
) -> int:
    """Output length of a 1-D transposed convolution (torch's formula)."""
    return (length - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


@attrs.frozen
class ConvShape:
    """One (transposed) convolution, checked: x [B, Cin, T] -> [B, Cout, T_out], its sizes
    and its parameters (what a backend's kernel needs besides the operands)."""

    batch: int
    c_in: int
    length: int
    c_out: int
    kernel: int
    groups: int
    out_length: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    output_padding: int = 0

    @property
    def c_in_g(self) -> int:
        """Input channels per group."""
        return self.c_in // self.groups

    @property
    def c_out_g(self) -> int:
        """Output channels per group."""
        return self.c_out // self.groups


def _dims(shape: Shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def _fail(op: str, detail: str, **shapes: Shape | None) -> ShapeError:
    named = ", ".join(f"{name} {_dims(s) if s is not None else None}" for name, s in shapes.items())
    return ShapeError(f"{op}: {detail} ({named})")


def _bias_fits(b: Shape | None, n: int) -> bool:
    """Whether a bias (None: no bias) has the ``n`` elements of the outputs it is added to."""
    return b is None or math.prod(b) == n


def _bias_error(op: str, b: Shape | None, n: int, **shapes: Shape | None) -> ShapeError:
    return _fail(op, f"the bias must have {n} elements", **shapes, b=b)


def _check_conv_params(op: str, stride: int, padding: int, dilation: int, groups: int) -> None:
    if stride < 1 or dilation < 1 or groups < 1 or padding < 0:
        raise ShapeError(
            f"{op}: stride {stride}, dilation {dilation} and groups {groups} must be >= 1, "
            f"padding {padding} >= 0"
        )


def conv1d_shape(
    x: Shape,
    w: Shape,
    b: Shape | None,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
) -> ConvShape:
    """Check conv1d's operands: x [B, Cin, T], w [Cout, Cin/groups, K], b [Cout]."""
    _check_conv_params("conv1d", stride, padding, dilation, groups)
    if len(x) != 3 or len(w) != 3:
        raise _fail("conv1d", "x and w must be 3-D", x=x, w=w)
    batch, c_in, length = _dims(x)
    c_out, c_in_g, kernel = _dims(w)
    if c_in != c_in_g * groups or c_out % groups:
        raise _fail("conv1d", f"channels don't match groups {groups}", x=x, w=w)
    if not _bias_fits(b, c_out):
        raise _bias_error("conv1d", b, c_out, x=x, w=w)
    out = conv1d_length(length, kernel, stride, padding, dilation)
    if out <= 0:
        raise _fail("conv1d", "input shorter than the kernel's receptive field", x=x, w=w)
    return ConvShape(batch, c_in, length, c_out, kernel, groups, out, stride, padding, dilation)


def conv_transpose1d_shape(
    x: Shape,
    w: Shape,
    b: Shape | None,
    stride: int = 1,
    padding: int = 0,
    output_padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
) -> ConvShape:
    """Check conv_transpose1d's operands: x [B, Cin, T], w [Cin, Cout/groups, K], b [Cout]."""
    _check_conv_params("conv_transpose1d", stride, padding, dilation, groups)
    if len(x) != 3 or len(w) != 3:
        raise _fail("conv_transpose1d", "x and w must be 3-D", x=x, w=w)
    batch, c_in, length = _dims(x)
    w_in, c_out_g, kernel = _dims(w)
    if w_in != c_in or c_in % groups:
        raise _fail("conv_transpose1d", f"channels don't match groups {groups}", x=x, w=w)
    c_out = c_out_g * groups
    if not _bias_fits(b, c_out):
        raise _bias_error("conv_transpose1d", b, c_out, x=x, w=w)
    out = conv_transpose1d_length(length, kernel, stride, padding, output_padding, dilation)
    if out <= 0:
        raise _fail("conv_transpose1d", "empty output", x=x, w=w)
    return ConvShape(
        batch, c_in, length, c_out, kernel, groups, out, stride, padding, dilation, output_padding
    )


def broadcast_shape(op: str, *shapes: Shape) -> tuple[int, ...]:
    """The broadcast of ``shapes`` (numpy's rules), or a ShapeError naming ``op``."""
    first = tuple(shapes[0]) if shapes else ()
    if all(tuple(s) == first for s in shapes[1:]):
        return first
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(_dims(s), ndim - len(s)):
            if d != out[i] and d != 1 and out[i] != 1:
                listed = " and ".join(str(_dims(t)) for t in shapes)
                raise ShapeError(f"{op}: shapes {listed} don't broadcast")
            if d != 1:
                out[i] = d
    return tuple(out)


def broadcasts_to(shape: Shape, target: Shape) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (numpy's rules) without growing it."""
    n = len(shape)
    if n > len(target):
        return False
    return all(d == 1 or d == t for d, t in zip(shape, target[len(target) - n :], strict=True))


def matmul_shape(a: Shape, b: Shape) -> tuple[int, ...]:
    """The shape of ``a @ b`` (numpy's matmul rules, 1-D operands included)."""
    if len(a) == 0 or len(b) == 0:
        raise _fail("matmul", "scalar operands are not allowed", a=a, b=b)
    a2 = (1, *_dims(a)) if len(a) == 1 else _dims(a)
    b2 = (*_dims(b), 1) if len(b) == 1 else _dims(b)
    if a2[-1] != b2[-2]:
        raise _fail("matmul", "inner dimensions don't align", a=a, b=b)
    try:
        lead = broadcast_shape("matmul", a2[:-2], b2[:-2])
    except ShapeError:
        raise _fail("matmul", "batch dimensions don't broadcast", a=a, b=b) from None
    out = [*lead, a2[-2], b2[-1]]
    if len(b) == 1:
        out.pop(-1)
    if len(a) == 1:
        out.pop(-2 if len(b) > 1 else -1)
    return tuple(out)


def linear_shape(x: Shape, w: Shape, b: Shape | None) -> tuple[int, ...]:
    """The shape of ``x @ w.T + b``: x [..., In], w [Out, In], b [Out]."""
    if len(w) != 2 or len(x) == 0 or x[-1] != w[1]:
        raise _fail("linear", "x must be [..., In] and w [Out, In]", x=x, w=w)
    if not _bias_fits(b, w[0]):
        raise _bias_error("linear", b, int(w[0]), x=x, w=w)
    return (*x[:-1], int(w[0]))


def attention_shape(q: Shape, k: Shape, v: Shape, mask: Shape | None) -> tuple[int, ...]:
    """The shape of attention over q [..., T, D], k [..., S, D], v [..., S, Dv]."""
    if min(len(q), len(k), len(v)) < 2 or q[-1] != k[-1] or k[-2] != v[-2]:
        raise _fail("attention", "need q [..., T, D], k [..., S, D], v [..., S, Dv]", q=q, k=k, v=v)
    lead = tuple(q[:-2])
    try:
        if tuple(k[:-2]) != lead or tuple(v[:-2]) != lead:
            lead = broadcast_shape("attention", lead, k[:-2], v[:-2])
        if mask is not None and not broadcasts_to(mask, (*lead, q[-2], k[-2])):
            raise ShapeError("attention: the mask must broadcast to the scores")
    except ShapeError:
        raise _fail("attention", "shapes don't broadcast", q=q, k=k, v=v, mask=mask) from None
    return (*lead, int(q[-2]), int(v[-1]))


def layer_norm_shape(x: Shape, gamma: Shape | None, beta: Shape | None) -> None:
    """Check layer_norm's operands: x [..., N], gamma and beta N elements each."""
    if len(x) == 0:
        raise _fail("layer_norm", "x must have a last axis", x=x)
    n = x[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None and math.prod(p) != n:
            raise _fail("layer_norm", f"{name} must have {n} elements", x=x, **{name: p})


def lstm_shape(
    x: Shape, h: Shape, c: Shape, w_ih: Shape, w_hh: Shape, b: Shape | None, *, sequence: bool
) -> None:
    """Check an LSTM's operands: x [T, B, In] (a sequence) or [..., In] (a cell), h and c
    [B, H] (a sequence) or [..., H] (a cell), w_ih [4H, In], w_hh [4H, H], b [4H]."""
    op = "lstm_sequence" if sequence else "lstm_cell"
    shapes = {"x": x, "h": h, "c": c, "w_ih": w_ih, "w_hh": w_hh}
    if len(w_ih) != 2 or len(w_hh) != 2 or len(h) == 0 or len(x) == 0:
        raise _fail(op, "w_ih and w_hh must be 2-D", **shapes)
    hid = int(h[-1])
    ok = (
        _dims(c) == _dims(h)
        and _dims(w_hh) == (4 * hid, hid)
        and _dims(w_ih) == (4 * hid, int(x[-1]))
    )
    if sequence:
        ok = ok and len(x) == 3 and len(h) == 2 and int(x[1]) == int(h[0])
    else:
        ok = ok and _dims(x[:-1]) == _dims(h[:-1])
    if not ok:
        raise _fail(op, "shapes don't match", **shapes)
    if not _bias_fits(b, 4 * hid):
        raise _bias_error(op, b, 4 * hid, **shapes)


def concat_shape(shapes: Sequence[Shape], axis: int) -> tuple[int, ...]:
    """The shape of ``shapes`` joined along ``axis``; the other dims must agree."""
    if not shapes:
        raise ShapeError("concat: need at least one array")
    first = _dims(shapes[0])
    if not -len(first) <= axis < len(first):
        raise ShapeError(f"concat: axis {axis} out of range for {first}")
    axis %= len(first)
    for s in shapes:
        d = _dims(s)
        if len(d) != len(first) or d[:axis] != first[:axis] or d[axis + 1 :] != first[axis + 1 :]:
            listed = [_dims(t) for t in shapes]
            raise ShapeError(f"concat: shapes {listed} differ off axis {axis}")
    return (*first[:axis], sum(int(s[axis]) for s in shapes), *first[axis + 1 :])


def write_slice_start(dst: Shape, axis: int, start: int, src: Shape) -> tuple[int, int]:
    """(axis, start) made non-negative, after checking that ``src`` fits ``dst`` there."""
    if len(src) != len(dst) or not -len(dst) <= axis < len(dst):
        raise _fail("write_slice", f"no axis {axis} shared", dst=dst, src=src)
    axis %= len(dst)
    count = src[axis]
    if start < 0:
        start += dst[axis]
    expected = (*dst[:axis], count, *dst[axis + 1 :])
    if tuple(src) != expected or start < 0 or start + count > dst[axis]:
        raise _fail("write_slice", f"src doesn't fit at {start} on axis {axis}", dst=dst, src=src)
    return axis, start


def reshape_shape(size: int, shape: Shape) -> tuple[int, ...]:
    """``shape`` with its one -1 resolved, for an array of ``size`` elements."""
    dims = [int(s) for s in shape]
    if dims.count(-1) > 1:
        raise ShapeError("reshape: only one dimension may be -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise ShapeError(f"reshape: can't reshape {size} elements into {tuple(shape)}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise ShapeError(f"reshape: can't reshape {size} elements into {tuple(shape)}")
    return tuple(dims)
