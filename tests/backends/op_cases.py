"""Op-level cases shared by the backend tests: every ArrayBackend op against numpy.

Each case builds random host inputs, runs the op on the numpy reference and on
the backend under test (inputs uploaded with ``to_device``, outputs read back
with ``to_host``) and compares within the tolerances declared here, per op,
before any comparison runs. Shapes exercise the GEMM tile edges (sizes around 16
and 32), broadcasting, groups, dilation, strides and padding.

Tolerances: elementwise ops ``rtol 1e-5 / atol 1e-6``; softmax ``rtol 1e-5 / atol
1e-8`` (probabilities can be tiny) and log_softmax ``1e-5 / 1e-6``. Ops that sum many terms
(GEMM, conv, reductions, softmax/LSTM/attention built on them) add in a
different order than BLAS/numpy's pairwise sums, so their absolute tolerance is
``1e-6 * sqrt(terms summed)`` (inputs are drawn so outputs are O(1)); every case
still uses ``rtol 1e-5``. Measured errors on PoCL are listed in docs/backends.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import pytest

from backends.base import ArrayBackend
from backends.numpy_backend import NumpyBackend
from backends.shapes import ShapeError

RTOL = 1e-5
ATOL = 1e-6


@attrs.frozen
class Case:
    """One comparison: ``call(backend, *uploaded inputs)`` on ``inputs(rng)``."""

    name: str
    inputs: Callable[[np.random.Generator], Sequence[np.ndarray]]
    call: Callable[..., Any]
    atol: float = ATOL
    rtol: float = RTOL
    dtypes: Sequence[Any] = ()  # upload dtype per input (default float32)


def _randn(*shape: int, scale: float = 1.0) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda r: (r.standard_normal(shape) * scale).astype(np.float32)


def _inputs(
    *makers: Callable[[np.random.Generator], np.ndarray],
) -> Callable[[np.random.Generator], list[np.ndarray]]:
    return lambda r: [m(r) for m in makers]


def _sum_atol(terms: int) -> float:
    return ATOL * max(1.0, math.sqrt(terms))


def _unary(op: str, *args: Any) -> Callable[..., Any]:
    return lambda be, x: getattr(be, op)(x, *args)


def _binary(op: str) -> Callable[..., Any]:
    return lambda be, a, b: getattr(be, op)(a, b)


def _cases() -> list[Case]:
    cases: list[Case] = []
    add = cases.append
    # ---- elementwise
    for op, args, maker in [
        ("exp", (), _randn(3, 5, 33)),
        ("sqrt", (), lambda r: np.abs(r.standard_normal((7, 130))).astype(np.float32) * 4),
        ("tanh", (), _randn(4, 257, scale=3)),
        ("sigmoid", (), _randn(4, 257, scale=5)),
        ("relu", (), _randn(1000)),
        ("leaky_relu", (0.1,), _randn(2, 3, 50)),
        ("leaky_relu", (-0.5,), _randn(2, 3, 50)),
        ("gelu", (), _randn(3, 300, scale=3)),
        ("scale", (0.37,), _randn(5, 6, 7)),
    ]:
        add(Case(f"{op}{args}", _inputs(maker), _unary(op, *args)))
    for op in ("add", "sub", "mul", "div"):
        for sa, sb in [
            ((4, 5, 6), (4, 5, 6)),
            ((4, 5, 6), (6,)),
            ((4, 5, 6), (5, 1)),
            ((4, 1, 6), (1, 5, 1)),
            ((2, 3, 4, 5), (3, 1, 5)),
            ((2, 1, 3, 1, 4, 1, 5), (1, 2, 1, 3, 1, 4, 1)),
            ((1,), (3, 7)),
        ]:
            second = (
                (lambda s: lambda r: (np.abs(r.standard_normal(s)) + 0.5).astype(np.float32))(sb)
                if op == "div"
                else _randn(*sb)
            )
            add(Case(f"{op}{sa}{sb}", _inputs(_randn(*sa), second), _binary(op)))
    # ---- reductions
    for shape, axis, keep in [
        ((3, 4, 5), 1, False),
        ((3, 4, 5), -1, True),
        ((6, 1000), -1, False),
        ((1000, 3), 0, True),
        ((2, 300, 2), 1, False),
    ]:
        n = shape[axis]
        add(
            Case(
                f"sum{shape}@{axis}",
                _inputs(_randn(*shape)),
                lambda be, x, a=axis, k=keep: be.sum(x, a, k),
                atol=_sum_atol(n),
            )
        )
        add(
            Case(
                f"max{shape}@{axis}",
                _inputs(_randn(*shape)),
                lambda be, x, a=axis, k=keep: be.max(x, a, k),
            )
        )
    for shape, axis in [
        ((3, 4, 5), -1),
        ((3, 4, 5), 1),
        ((2, 51864), -1),
        ((5, 200), -1),
        ((200, 5), 0),
        ((4, 37), -1),
    ]:
        for op in ("softmax", "log_softmax"):
            # probabilities can be tiny: a small absolute floor, so rtol does the checking
            atol = 1e-8 if op == "softmax" else ATOL
            add(
                Case(
                    f"{op}{shape}@{axis}",
                    _inputs(_randn(*shape, scale=3)),
                    lambda be, x, o=op, a=axis: getattr(be, o)(x, a),
                    atol=atol,
                )
            )
    # ---- shape ops (exact)
    add(
        Case(
            "reshape",
            _inputs(_randn(4, 6, 5)),
            lambda be, x: be.reshape(x, (2, -1, 5)),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "transpose",
            _inputs(_randn(2, 3, 4, 5)),
            lambda be, x: be.transpose(x, (2, 0, 3, 1)),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "transpose2d",
            _inputs(_randn(33, 65)),
            lambda be, x: be.transpose(x, (1, 0)),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "concat1",
            _inputs(_randn(2, 3, 4), _randn(2, 5, 4), _randn(2, 1, 4)),
            lambda be, a, b, c: be.concat([a, b, c], 1),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "concat-1",
            _inputs(_randn(3, 2), _randn(3, 7)),
            lambda be, a, b: be.concat([a, b], -1),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "concat0",
            _inputs(_randn(2, 5), _randn(3, 5)),
            lambda be, a, b: be.concat([a, b], 0),
            atol=0,
            rtol=0,
        )
    )
    for axis, start, stop in [(0, 1, 3), (1, 2, 5), (-1, 0, 1), (2, -3, 7)]:
        add(
            Case(
                f"slice{axis}:{start}:{stop}",
                _inputs(_randn(4, 6, 7)),
                lambda be, x, a=axis, s=start, e=stop: be.slice(x, a, s, e),
                atol=0,
                rtol=0,
            )
        )
    for mode, before, after in [
        ("constant", 2, 3),
        ("reflect", 3, 2),
        ("edge", 4, 1),
        ("symmetric", 2, 3),
        ("constant", 0, 5),
    ]:
        add(
            Case(
                f"pad-{mode}{before},{after}",
                _inputs(_randn(2, 5, 3)),
                lambda be, x, m=mode, b=before, a=after: be.pad(x, 1, b, a, m),
                atol=0,
                rtol=0,
            )
        )
    add(
        Case(
            "pad-last-reflect",
            _inputs(_randn(2, 3, 9)),
            lambda be, x: be.pad(x, -1, 4, 4, "reflect"),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "take-rows",
            _inputs(_randn(10, 8)),
            lambda be, x: be.take(x, np.array([3, 0, 9, 3, -1]), 0),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "take-flip",
            _inputs(_randn(2, 6, 3)),
            lambda be, x: be.take(x, np.arange(6)[::-1].copy(), 1),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "take-2d",
            _inputs(_randn(7, 4)),
            lambda be, x: be.take(x, np.array([[1, 2], [6, 0]]), 0),
            atol=0,
            rtol=0,
        )
    )
    add(
        Case(
            "take-int",
            lambda r: [r.integers(0, 100, (5, 4)).astype(np.int32)],
            lambda be, x: be.take(x, np.array([4, 1]), 0),
            atol=0,
            rtol=0,
            dtypes=(np.int32,),
        )
    )
    add(Case("zeros", lambda r: [], lambda be: be.zeros((3, 4)), atol=0, rtol=0))

    def write(be: ArrayBackend, dst: Any, src: Any) -> Any:
        be.write_slice(dst, 1, 2, src)
        return dst

    add(Case("write_slice", _inputs(_randn(2, 8, 3), _randn(2, 3, 3)), write, atol=0, rtol=0))
    # ---- matmul family (shapes around the 32x32x16 tiles)
    for sa, sb in [
        ((37, 70), (70, 45)),
        ((64, 32), (32, 64)),
        ((1, 384), (384, 51)),
        ((33, 17), (17, 1)),
        ((3, 37, 20), (3, 20, 45)),
        ((2, 3, 5, 16), (16, 7)),
        ((2, 1, 5, 16), (3, 16, 7)),
        ((4, 9, 16), (1, 16, 9)),
        ((20,), (20, 6)),
        ((3, 2, 40), (3, 40, 70)),
        ((4, 6, 20), (20,)),
    ]:
        k = sa[-1]
        add(
            Case(
                f"matmul{sa}{sb}",
                _inputs(_randn(*sa, scale=1 / math.sqrt(k)), _randn(*sb)),
                _binary("matmul"),
                atol=_sum_atol(k),
            )
        )
    for lead, d_in, d_out, bias in [
        ((2, 13), 48, 40, True),
        ((1500,), 64, 96, True),
        ((5,), 7, 3, False),
        ((1,), 384, 1536, True),
    ]:
        makers = [_randn(*lead, d_in, scale=1 / math.sqrt(d_in)), _randn(d_out, d_in)] + (
            [_randn(d_out)] if bias else []
        )
        add(
            Case(
                f"linear{lead}x{d_in}->{d_out}{'+b' if bias else ''}",
                _inputs(*makers),
                lambda be, *a: be.linear(*a),
                atol=_sum_atol(d_in),
            )
        )
    for b, cin, cout, t, k, stride, pad, dil, groups, bias in [
        (2, 8, 12, 50, 3, 1, 1, 1, 1, True),
        (2, 8, 12, 50, 3, 2, 2, 2, 2, True),
        (1, 16, 16, 40, 5, 1, 4, 2, 16, False),
        (1, 6, 9, 33, 7, 3, 0, 1, 3, True),
        (3, 4, 5, 17, 1, 1, 0, 1, 1, True),
        (1, 35, 33, 70, 3, 1, 1, 1, 1, False),
        (1, 192, 192, 64, 3, 1, 3, 3, 1, True),
        (1, 40, 24, 100, 3, 2, 1, 1, 1, True),
    ]:
        terms = cin // groups * k
        makers = [_randn(b, cin, t), _randn(cout, cin // groups, k, scale=1 / math.sqrt(terms))] + (
            [_randn(cout)] if bias else []
        )
        add(
            Case(
                f"conv1d b{b} {cin}->{cout} t{t} k{k} s{stride} p{pad} d{dil} g{groups}",
                _inputs(*makers),
                lambda be, *a, s=stride, p=pad, d=dil, g=groups: (
                    be.conv1d(*a, stride=s, padding=p, dilation=d, groups=g)
                    if len(a) == 3
                    else be.conv1d(a[0], a[1], None, s, p, d, g)
                ),
                atol=_sum_atol(terms),
            )
        )
    for b, cin, cout_g, t, k, stride, pad, opad, dil, groups, bias in [
        (2, 8, 3, 10, 5, 3, 1, 1, 1, 2, True),
        (1, 16, 8, 12, 16, 8, 4, 0, 1, 1, True),
        (1, 6, 4, 9, 3, 1, 1, 0, 2, 1, False),
        (2, 4, 4, 7, 4, 2, 1, 0, 1, 4, True),
    ]:
        terms = cin // groups * k
        makers = [_randn(b, cin, t), _randn(cin, cout_g, k, scale=1 / math.sqrt(terms))] + (
            [_randn(cout_g * groups)] if bias else []
        )
        add(
            Case(
                f"conv_transpose1d b{b} {cin}->{cout_g * groups} t{t} k{k} "
                f"s{stride} p{pad} op{opad} d{dil} g{groups}",
                _inputs(*makers),
                lambda be, x, w, *bb, s=stride, p=pad, o=opad, d=dil, g=groups: be.conv_transpose1d(
                    x, w, bb[0] if bb else None, s, p, o, d, g
                ),
                atol=_sum_atol(terms),
            )
        )
    for shape, affine in [((4, 384), True), ((2, 3, 192), True), ((5, 7), False), ((3, 64), True)]:
        d = shape[-1]
        makers = [_randn(*shape, scale=2)] + ([_randn(d), _randn(d)] if affine else [])
        add(
            Case(
                f"layer_norm{shape}{'+affine' if affine else ''}",
                _inputs(*makers),
                (lambda be, x, g, b: be.layer_norm(x, g, b))
                if affine
                else (lambda be, x: be.layer_norm(x, None, None)),
                atol=_sum_atol(d),
            )
        )
    add(
        Case(
            "layer_norm gamma-only",
            _inputs(_randn(3, 200), _randn(200)),
            lambda be, x, g: be.layer_norm(x, g, None, 1e-6),
            atol=_sum_atol(200),
        )
    )
    # ---- recurrent and attention
    for steps, batch, d_in, hid in [(6, 3, 16, 32), (4, 1, 128, 128), (0, 2, 8, 8)]:
        makers = [
            _randn(steps, batch, d_in),
            _randn(batch, hid),
            _randn(batch, hid),
            _randn(4 * hid, d_in, scale=1 / math.sqrt(d_in)),
            _randn(4 * hid, hid, scale=1 / math.sqrt(hid)),
            _randn(4 * hid),
        ]
        add(
            Case(
                f"lstm_sequence T{steps} B{batch} {d_in}->{hid}",
                _inputs(*makers),
                lambda be, *a: be.lstm_sequence(*a),
                atol=_sum_atol(d_in + hid),
            )
        )
    makers = [
        _randn(3, 20),
        _randn(3, 24),
        _randn(3, 24),
        _randn(96, 20, scale=0.2),
        _randn(96, 24, scale=0.2),
        _randn(96),
    ]
    add(Case("lstm_cell", _inputs(*makers), lambda be, *a: be.lstm_cell(*a), atol=_sum_atol(44)))
    add(
        Case(
            "lstm_cell nobias",
            _inputs(*makers[:5]),
            lambda be, *a: be.lstm_cell(*a, None),
            atol=_sum_atol(44),
        )
    )
    causal = np.triu(np.full((40, 40), -np.inf, np.float32), 1)
    add(
        Case(
            "attention causal",
            lambda r: [
                _randn(2, 3, 40, 16)(r),
                _randn(2, 3, 40, 16)(r),
                _randn(2, 3, 40, 16)(r),
                causal,
            ],
            lambda be, q, k, v, m: be.attention(q, k, v, m),
            atol=_sum_atol(40),
        )
    )
    add(
        Case(
            "attention cross scale",
            _inputs(_randn(1, 6, 5, 64), _randn(1, 6, 75, 64), _randn(1, 6, 75, 64)),
            lambda be, q, k, v: be.attention(q, k, v, None, 0.125),
            atol=_sum_atol(75),
        )
    )
    add(
        Case(
            "attention key-padding mask",
            lambda r: [
                _randn(2, 4, 9, 8)(r),
                _randn(2, 4, 11, 8)(r),
                _randn(2, 4, 11, 8)(r),
                np.where(r.random((2, 1, 1, 11)) < 0.3, -1e9, 0).astype(np.float32),
            ],
            lambda be, q, k, v, m: be.attention(q, k, v, m),
            atol=_sum_atol(11),
        )
    )
    # long enough for numpy's query tiles (over 2**21 score elements): causal rows, and a
    # key-padding mask broadcast over heads with a scale that is not a power of two
    long_causal = np.triu(np.full((1100, 1100), -np.inf, np.float32), 1)
    add(
        Case(
            "attention long causal",
            lambda r: [
                _randn(1, 2, 1100, 16)(r),
                _randn(1, 2, 1100, 16)(r),
                _randn(1, 2, 1100, 16)(r),
                long_causal,
            ],
            lambda be, q, k, v, m: be.attention(q, k, v, m),
            atol=_sum_atol(1100),
        )
    )
    add(
        Case(
            "attention long key-padding scale",
            lambda r: [
                _randn(2, 1, 1050, 8)(r),
                _randn(2, 1, 1060, 8)(r),
                _randn(1, 1, 1060, 8)(r),
                np.where(r.random((2, 1, 1, 1060)) < 0.3, -1e9, 0).astype(np.float32),
            ],
            lambda be, q, k, v, m: be.attention(q, k, v, m, 0.3),
            atol=_sum_atol(1060),
        )
    )
    return cases


CASES = _cases()


def run_case(
    case: Case, backend: ArrayBackend, seed: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(reference outputs, backend outputs) for one case, as host arrays."""
    host = list(case.inputs(np.random.default_rng(seed)))
    ref = NumpyBackend()
    expected = _outputs(case.call(ref, *[np.array(h) for h in host]), ref)
    dtypes = list(case.dtypes) + [np.float32] * (len(host) - len(case.dtypes))
    dev = [backend.to_device(h, dt) for h, dt in zip(host, dtypes, strict=True)]
    got = _outputs(case.call(backend, *dev), backend)
    return expected, got


def _outputs(out: Any, be: ArrayBackend) -> list[np.ndarray]:
    items = out if isinstance(out, tuple) else (out,)
    return [np.asarray(be.to_host(o)) for o in items]


def max_errors(expected: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    """(max absolute error, max relative error where |expected| > 1e-3) over all outputs."""
    abs_err, rel_err = 0.0, 0.0
    for e, g in zip(expected, got, strict=True):
        if e.size == 0:
            continue
        finite = np.isfinite(e)
        diff = np.abs(e[finite].astype(np.float64) - g[finite])
        abs_err = max(abs_err, float(diff.max(initial=0.0)))
        big = np.abs(e[finite]) > 1e-3
        if big.any():
            rel_err = max(rel_err, float((diff[big] / np.abs(e[finite][big])).max()))
    return abs_err, rel_err


def assert_matches(case: Case, expected: list[np.ndarray], got: list[np.ndarray]) -> None:
    assert len(expected) == len(got)
    for e, g in zip(expected, got, strict=True):
        assert g.shape == e.shape, (g.shape, e.shape)
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol, err_msg=case.name)


def interface_ops() -> set[str]:
    """The public methods of the ArrayBackend protocol (base.OPS)."""
    from backends.base import OPS

    return set(OPS)


def covered_ops() -> set[str]:
    """Ops some case calls (the case name starts with the op), plus the transfers."""
    names = {m.group(0) for c in CASES if (m := re.match(r"[a-z_]+(1d)?", c.name))}
    return names | {"to_device", "to_host"}


@attrs.frozen
class BadCase:
    """Operands whose shapes ``op`` cannot take: every backend raises ShapeError naming it."""

    op: str
    shapes: Sequence[tuple[int, ...]]
    call: Callable[..., Any]

    @property
    def name(self) -> str:
        return f"{self.op}{list(self.shapes)}"


def _bad_cases() -> list[BadCase]:
    def conv(**kw: int) -> Callable[..., Any]:
        return lambda be, x, w, *b: be.conv1d(x, w, b[0] if b else None, **kw)

    def conv_t(**kw: int) -> Callable[..., Any]:
        return lambda be, x, w, *b: be.conv_transpose1d(x, w, b[0] if b else None, **kw)

    def write(be: ArrayBackend, dst: Any, src: Any) -> None:
        be.write_slice(dst, 1, 6, src)

    cases = [BadCase(op, [(4, 5), (3,)], _binary(op)) for op in ("add", "sub", "mul", "div")]
    cases += [
        BadCase("add", [(2, 3), (4, 1, 2)], _binary("add")),
        BadCase("matmul", [(3, 4), (5, 6)], _binary("matmul")),
        BadCase("matmul", [(2, 3, 4), (3, 4, 5)], _binary("matmul")),
        BadCase("matmul", [(7,), (6,)], _binary("matmul")),
        BadCase("linear", [(2, 5), (4, 6)], lambda be, x, w: be.linear(x, w)),
        BadCase("linear", [(2, 6), (4, 6), (3,)], lambda be, x, w, b: be.linear(x, w, b)),
        BadCase("conv1d", [(1, 6, 20), (4, 4, 3)], conv(groups=2)),
        BadCase("conv1d", [(1, 6, 20), (5, 3, 3)], conv(groups=2)),
        BadCase("conv1d", [(1, 2, 3), (2, 2, 5)], conv()),
        BadCase("conv1d", [(1, 2, 9), (3, 2, 3), (4,)], conv(padding=1)),
        BadCase("conv1d", [(2, 9), (3, 2, 3)], conv()),
        BadCase("conv1d", [(1, 2, 9), (3, 2, 3)], conv(stride=0)),
        BadCase("conv_transpose1d", [(1, 4, 10), (3, 2, 4)], conv_t(stride=2)),
        BadCase("conv_transpose1d", [(1, 2, 1), (2, 2, 1)], conv_t(padding=1)),
        BadCase("conv_transpose1d", [(1, 4, 10), (4, 2, 4), (3,)], conv_t(stride=2, groups=2)),
        BadCase("layer_norm", [(3, 8), (7,)], lambda be, x, g: be.layer_norm(x, g, None)),
        BadCase("layer_norm", [(3, 8), (8,), (4,)], lambda be, x, g, b: be.layer_norm(x, g, b)),
        BadCase(
            "lstm_sequence",
            [(4, 2, 6), (2, 5), (2, 5), (20, 6), (20, 4)],
            lambda be, *a: be.lstm_sequence(*a, None),
        ),
        BadCase(
            "lstm_sequence",
            [(4, 3, 6), (2, 5), (2, 5), (20, 6), (20, 5)],
            lambda be, *a: be.lstm_sequence(*a, None),
        ),
        BadCase(
            "lstm_cell",
            [(2, 6), (2, 5), (3, 5), (20, 6), (20, 5), (20,)],
            lambda be, *a: be.lstm_cell(*a),
        ),
        BadCase(
            "attention", [(1, 2, 5, 8), (1, 2, 6, 4), (1, 2, 6, 8)], lambda be, *a: be.attention(*a)
        ),
        BadCase(
            "attention", [(1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 7, 8)], lambda be, *a: be.attention(*a)
        ),
        BadCase(
            "attention",
            [(1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), (5, 5)],
            lambda be, *a: be.attention(*a),
        ),
        BadCase("concat", [(2, 3), (3, 4)], lambda be, a, b: be.concat([a, b], 0)),
        BadCase("write_slice", [(2, 8, 3), (2, 3, 3)], write),
        BadCase("write_slice", [(2, 8, 3), (2, 2, 1)], lambda be, d, s: be.write_slice(d, 1, 0, s)),
        BadCase("reshape", [(4, 6)], lambda be, x: be.reshape(x, (5, -1))),
    ]
    return cases


BAD_CASES = _bad_cases()


def call_bad(case: BadCase, backend: ArrayBackend) -> Any:
    """Upload random operands of the case's shapes and call the op (which should raise)."""
    rng = np.random.default_rng(0)
    args = [backend.to_device(rng.standard_normal(s).astype(np.float32)) for s in case.shapes]
    return case.call(backend, *args)


# ---- the checks every backend's op tests run ---------------------------------------------

over_cases = pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
"""Parametrise a test over every op case (its argument ``case``)."""

over_bad_cases = pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.name)
"""Parametrise a test over every bad-shape case (its argument ``case``)."""


def check_case(case: Case, backend: ArrayBackend) -> None:
    """The backend's outputs for ``case`` match the numpy reference within its tolerances."""
    expected, got = run_case(case, backend)
    assert_matches(case, expected, got)


def check_bad_case(case: BadCase, backend: ArrayBackend) -> None:
    """The backend refuses the case's operands with the shared ShapeError naming the op."""
    with pytest.raises(ShapeError, match=f"^{case.op}: "):
        call_bad(case, backend)


def missing_ops(cls: type) -> set[str]:
    """The interface ops (:data:`backends.base.OPS`) that ``cls`` does not implement."""
    return {op for op in interface_ops() if not callable(getattr(cls, op, None))}
