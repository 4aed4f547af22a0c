"""Winograd's minimal filtering for Piper's wide undilated convolutions: fewer multiplications.

A stride-1 Conv1d of ``r`` taps computes each output column from ``r`` input
columns; on the numpy backend it is ``r`` GEMMs over shifted views of its input
(:func:`backends.piper.blas.conv_taps`), ``2 r C_out C_in`` FLOPs a column, and its
time is those GEMMs'. Winograd's ``F(m, r)`` (Lavin and Gray, "Fast Algorithms for
Convolutional Neural Networks", 2016) computes ``m`` neighbouring outputs at once
from ``L = m + r - 1`` inputs with only ``L`` products instead of ``m r``: the
inputs of each block of ``m`` columns are transformed (``V = B^T z``, adds and a
few scalings per channel), multiplied by transformed filters (``U = G g``, once
per model), one GEMM per point (``M_i = U_i V_i``, ``L`` GEMMs over ``n / m``
columns) and transformed back (``y = A^T M``). ``F(4, 5)`` needs 8 products for
20, ``F(2, 7)`` 8 for 14: the flow's coupling convs (192 -> 384 channels, 5 taps)
take 0.64 of their per-tap time (``F(2, 5)``, 6 for 10: 0.74-0.75), the decoder's
first conv (192 -> 256, 7 taps) 0.79-0.84 (``bench/piper_convs.py``). Narrower
convs are left to the per-tap GEMMs (from :data:`MIN_CHANNELS_PRODUCT` down): the
transforms (a pass over the input and one over the output) cost about what the
smaller GEMMs save, the first HiFi-GAN
stage's 3-tap conv (128 channels, ``F(4, 3)``, 6 products for 12) took 0.93-0.97 of
its time alone and made the stage no faster in place; dilated convs are left to
them too: :func:`prepare` says which convs take this path.

The transforms are Toom-Cook's over the interpolation points of :data:`POINTS`
(and infinity), built and checked exactly with fractions (:func:`transform`);
the kernels are numba loops unrolled for each ``(m, r)`` and generated from those
matrices into :mod:`backends.piper.winograd_kernels` (``python -m
backends.piper.winograd`` writes it; a test requires the file to match). Values
differ from the per-tap GEMMs' by float32 rounding only: about 2e-6 of a conv's
largest output on Piper's weights (``F(4, 5)`` up to 2.6e-6, the per-tap GEMMs
4e-7 against float64; the points 0, +-1, +-2, +-1/2 keep the transforms' constants
small); the per-conv and end-to-end tolerances
(``tests/models/test_piper_winograd.py``, the parity tests against onnxruntime)
bound them. A column's value depends on where its block of ``m`` starts (the
tile), never on memory outside the conv's input window: inputs past the window
are read as zeros, so results are deterministic whatever a buffer held before.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import attrs
import numpy as np

from backends import kernels

POINTS: dict[tuple[int, int], tuple[Fraction, ...]] = {
    (4, 3): tuple(Fraction(p) for p in (0, 1, -1, 2, -2)),
    (4, 5): tuple(Fraction(p) for p in (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2))),
    (2, 7): tuple(Fraction(p) for p in (0, 1, -1, 2, -2, Fraction(1, 2), Fraction(-1, 2))),
}
"""The finite interpolation points of each ``F(m, r)`` this module has kernels for (the
last point is infinity); ``m + r - 2`` of them."""

OUTPUTS = {3: 4, 5: 4, 7: 2}
"""``m``, the outputs of a block, for a conv of ``r`` taps."""

MIN_CHANNELS_PRODUCT = 192 * 192
"""Fewest ``C_in * C_out`` for a conv to take this path (see the module doc)."""


@attrs.frozen
class Transform:
    """``F(m, r)``'s matrices, exact: ``y = A^T [(G g) * (B^T z)]`` for ``m`` outputs ``y`` of
    a correlation of ``r`` taps ``g`` with ``m + r - 1`` inputs ``z``."""

    m: int
    r: int
    at: tuple[tuple[Fraction, ...], ...]
    g: tuple[tuple[Fraction, ...], ...]
    bt: tuple[tuple[Fraction, ...], ...]

    @property
    def points(self) -> int:
        """``L = m + r - 1``: products (GEMMs) a block."""
        return self.m + self.r - 1


def _poly(roots: list[Fraction]) -> list[Fraction]:
    """Coefficients (ascending powers) of ``prod (x - root)``."""
    coeffs = [Fraction(1)]
    for root in roots:
        nxt = [Fraction(0)] * (len(coeffs) + 1)
        for k, c in enumerate(coeffs):
            nxt[k + 1] += c
            nxt[k] -= root * c
        coeffs = nxt
    return coeffs


@functools.cache
def transform(m: int, r: int) -> Transform:
    """Toom-Cook's ``F(m, r)`` over :data:`POINTS` and infinity, checked exactly.

    With points ``a_i`` and ``M(x) = prod (x - a_i)``: ``A^T[q, i] = a_i^q`` (the last
    column picks the top output), ``G[i, k] = a_i^k / M'(a_i)`` (the last row the top
    tap), and ``B^T``'s rows the coefficients of ``M(x) / (x - a_i)`` (the last row
    ``M(x)`` itself)."""
    pts = list(POINTS[(m, r)])
    n = m + r - 1
    if len(pts) != n - 1 or len(set(pts)) != len(pts):
        raise ValueError(f"F({m}, {r}) needs {n - 1} distinct points")
    at = [[p**q for p in pts] + [Fraction(int(q == m - 1))] for q in range(m)]
    g = []
    for i, p in enumerate(pts):
        d = Fraction(1)
        for j, o in enumerate(pts):
            if j != i:
                d *= p - o
        g.append([p**k / d for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    bt = [[*_poly([o for j, o in enumerate(pts) if j != i]), Fraction(0)] for i in range(n - 1)]
    bt.append(_poly(pts))
    t = Transform(m, r, tuple(map(tuple, at)), tuple(map(tuple, g)), tuple(map(tuple, bt)))
    _check(t)
    return t


def _check(t: Transform) -> None:
    """``sum_i A^T[q, i] G[i, k] B^T[i, l] = [l == q + k]``: the transform is a correlation."""
    for q in range(t.m):
        for k in range(t.r):
            for col in range(t.points):
                s = sum(t.at[q][i] * t.g[i][k] * t.bt[i][col] for i in range(t.points))
                if s != int(col == q + k):
                    raise ArithmeticError(f"F({t.m}, {t.r}): not a correlation at {q, k, col}")


Kernels = tuple[Callable[..., None], Callable[..., None]]
"""An ``F(m, r)``'s compiled input and output transforms."""


@attrs.frozen(eq=False)
class Filters:
    """A conv's taps transformed for ``F(m, r)``: ``u [L, C_out, C_in]`` (``U_i = sum_k G[i, k]
    W_k``, in float64 then rounded once), and the transform's compiled kernels."""

    transform: Transform
    u: np.ndarray
    kernels: Kernels

    @property
    def c_out(self) -> int:
        return int(self.u.shape[1])

    @property
    def c_in(self) -> int:
        return int(self.u.shape[2])


def prepare(taps: np.ndarray, dilation: int) -> Filters | None:
    """Per-tap matrices ``[K, C_out, C_in]`` as :class:`Filters`, or None where this path does
    not apply: dilated convs, kernels without a transform here, fewer channels than
    :data:`MIN_CHANNELS_PRODUCT`, or kernels that failed to load."""
    k, c_out, c_in = taps.shape
    if dilation != 1 or c_in * c_out < MIN_CHANNELS_PRODUCT:
        return None
    return filters(taps)


def filters(taps: np.ndarray) -> Filters | None:
    """Per-tap matrices ``[K, C_out, C_in]`` as :class:`Filters` for the ``F(m, K)`` of
    :data:`OUTPUTS` whatever the channels (None: no kernels for ``K``)."""
    k = taps.shape[0]
    m = OUTPUTS.get(k)
    found = None if m is None else _kernels(m, k)
    if m is None or found is None:
        return None
    t = transform(m, k)
    g = np.array([[float(v) for v in row] for row in t.g])  # [L, r]
    u = np.einsum("ik,kab->iab", g, np.asarray(taps, np.float64))
    return Filters(t, np.ascontiguousarray(u, dtype=np.float32), found)


def _kernels(m: int, r: int) -> Kernels | None:
    """The compiled input and output transforms of ``F(m, r)`` (None without numba's kernels)."""
    try:
        from backends.piper import winograd_kernels
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    found = (
        getattr(winograd_kernels, f"input_{m}_{r}", None),
        getattr(winograd_kernels, f"output_{m}_{r}", None),
    )
    if found[0] is None or found[1] is None:
        return None
    return found  # type: ignore[return-value]


_LOCAL = threading.local()


def _scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 buffer of ``shape`` for this thread, reused from call to call."""
    found: dict[str, np.ndarray] | None = getattr(_LOCAL, "buffers", None)
    if found is None:
        found = _LOCAL.buffers = {}
    size = math.prod(shape)
    buf = found.get(name)
    if buf is None or buf.size < size:
        buf = found[name] = np.empty(size, np.float32)
    return buf[:size].reshape(shape)


def conv_add(out: np.ndarray, f: Filters, src: np.ndarray, start: int) -> None:
    """``out += conv(src)``: ``out[:, j] += sum_k W_k @ src[:, start + j + k]`` for the ``n``
    columns of ``out [C_out, n]`` (no bias), with ``src [C_in, *]`` holding at least
    ``start + n + r - 1`` columns; columns beyond those are never read (zeros in their
    place). Both unit column stride, ``out`` not overlapping ``src``."""
    t = f.transform
    c_out, n = out.shape
    if src.shape[0] != f.c_in or c_out != f.c_out:
        raise ValueError("winograd: channels do not match the filters")
    if start < 0 or start + n + t.r - 1 > src.shape[1]:
        raise ValueError("winograd: the conv's window runs outside the source")
    if n == 0 or c_out == 0:
        return
    if np.may_share_memory(out, src):
        raise ValueError("winograd: the output overlaps the source")
    to_points, from_points = f.kernels
    a, lda = kernels.flat_rows(src, writeable=False)
    o, ldo = kernels.flat_rows(out, writeable=True)
    blocks = -(-n // t.m)
    v = _scratch("v", (t.points, f.c_in, blocks))
    phases = _scratch("phases", (t.m, blocks + (t.points - 1) // t.m))
    to_points(a, lda, start, n + t.r - 1, v, phases)
    products = _scratch("products", (t.points, c_out, blocks))
    np.matmul(f.u, v, out=products)
    from_points(products, o, ldo, n, phases)


# ---- the kernels' source ------------------------------------------------------------------

_HEADER = '''"""Generated by ``python -m backends.piper.winograd`` from the transforms of
:mod:`backends.piper.winograd`: do not edit.

``input_m_r`` writes ``v[i, c, b] = sum_j B^T[i, j] src[c, start + m b + j]`` (inputs at
or past ``avail`` read as zeros, ``phases`` a scratch of each row's ``m`` phases);
``output_m_r`` adds ``sum_i A^T[q, i] M[i, c, b]`` to ``out[c, m b + q]`` for the columns
below ``n`` (``ys`` a scratch). Matrices as flat views with their row strides
(:func:`backends.kernels.flat_rows`)."""

# ruff: noqa
# fmt: off
from __future__ import annotations

from typing import Any

import numpy as np
from numba import types

from backends.kernels import array_type, kernel

_IN1, _IN3 = array_type(1, readonly=True), array_type(3, readonly=True)
_OUT1, _OUT2, _OUT3 = array_type(1), array_type(2), array_type(3)
_ZERO = np.float32(0.0)
'''


def _term(coef: Fraction, name: str, consts: dict[Fraction, str]) -> str:
    if coef == 1:
        return f"+ {name}"
    if coef == -1:
        return f"- {name}"
    sign = "-" if coef < 0 else "+"
    mag = abs(coef)
    if mag not in consts:
        consts[mag] = f"_K{len(consts)}"
    return f"{sign} {consts[mag]} * {name}"


def _sum(coefs: tuple[Fraction, ...], names: list[str], consts: dict[Fraction, str]) -> str:
    terms = [_term(c, v, consts) for c, v in zip(coefs, names, strict=True) if c != 0]
    if not terms:
        return "_ZERO"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else f"-{text[2:]}"


def _header(types_: str, name: str, params: str) -> list[str]:
    """A generated kernel's first lines: its signature for :func:`backends.kernels.kernel`, and
    its ``def`` with every parameter typed ``Any``."""
    typed = ", ".join(f"{p}: Any" for p in params.split(", "))
    return [
        "",
        "",
        f"@kernel(types.void({types_}))",
        f"def {name}({typed}) -> None:  # pragma: no cover",
    ]


def _input_source(t: Transform, consts: dict[Fraction, str]) -> list[str]:
    m, n = t.m, t.points
    z = [f"z{j}" for j in range(n)]
    lines = _header(
        "_IN1, types.int64, types.int64, types.int64, _OUT3, _OUT2",
        f"input_{m}_{t.r}",
        "src, ld, start, avail, v, phases",
    )
    lines += [
        "    blocks = v.shape[2]",
        "    width = phases.shape[1]",
        f"    full = min(width, avail // {m})",
        "    for c in range(v.shape[1]):",
        "        row = c * ld + start",
    ]
    lines += [f"        ph{p} = phases[{p}]" for p in range(m)]
    lines += ["        for b in range(full):", f"            at = row + {m} * b"]
    lines += [f"            ph{p}[b] = src[at + {p}]" for p in range(m)]
    lines += ["        for b in range(full, width):", f"            first = {m} * b"]
    lines += [
        f"            ph{p}[b] = src[row + first + {p}] if first + {p} < avail else _ZERO"
        for p in range(m)
    ]
    lines += [f"        v{i} = v[{i}, c]" for i in range(n)]
    lines += ["        for b in range(blocks):"]
    lines += [f"            z{j} = ph{j % m}[b + {j // m}]" for j in range(n)]
    lines += [f"            v{i}[b] = {_sum(t.bt[i], z, consts)}" for i in range(n)]
    return lines


def _output_source(t: Transform, consts: dict[Fraction, str]) -> list[str]:
    m, n = t.m, t.points
    p = [f"p{i}" for i in range(n)]
    lines = _header(
        "_IN3, _OUT1, types.int64, types.int64, _OUT2",
        f"output_{m}_{t.r}",
        "products, out, ld, n, ys",
    )
    lines += [
        "    blocks = products.shape[2]",
        f"    full = n // {m}",
        "    for c in range(products.shape[1]):",
        "        row = c * ld",
    ]
    lines += [f"        q{i} = products[{i}, c]" for i in range(n)]
    lines += [f"        y{k} = ys[{k}]" for k in range(m)]
    lines += ["        for b in range(blocks):"]
    lines += [f"            p{i} = q{i}[b]" for i in range(n)]
    lines += [f"            y{k}[b] = {_sum(t.at[k], p, consts)}" for k in range(m)]
    lines += ["        for b in range(full):", f"            at = row + {m} * b"]
    lines += [f"            out[at + {k}] += y{k}[b]" for k in range(m)]
    lines += [
        f"        for k in range(n - {m} * full):",
        f"            out[row + {m} * full + k] += ys[k, full]",
    ]
    return lines


def generate_kernels() -> str:
    """The source of :mod:`backends.piper.winograd_kernels`."""
    consts: dict[Fraction, str] = {}
    body: list[str] = []
    for m, r in sorted(POINTS):
        t = transform(m, r)
        body += _input_source(t, consts) + _output_source(t, consts)
    defs = [f"{name} = np.float32({float(v)!r})" for v, name in consts.items()]
    return _HEADER + "\n".join(defs) + "\n" + "\n".join(body) + "\n"


KERNELS_PATH = Path(__file__).with_name("winograd_kernels.py")


def main(argv: list[str]) -> int:
    """Write :mod:`backends.piper.winograd_kernels` (``--check``: only say if it is current)."""
    text = generate_kernels()
    if "--check" in argv:
        current = KERNELS_PATH.read_text() if KERNELS_PATH.exists() else ""
        print("current" if current == text else "stale")
        return 0 if current == text else 1
    KERNELS_PATH.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
