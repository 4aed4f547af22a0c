"""Packed weights and their product (backends/panels.py, kernels.panel_product): the values
of a float32 sum in a fixed order, whatever rows share a call and whichever core computes."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import handoff, kernels, panels, parallel
from backends.intrinsics import HALVES


def _in_order(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``x @ w.T + bias`` in float32, each output its bias plus the terms in ascending order,
    a rounded multiply then a rounded add each (numpy's float32 ufuncs round each op)."""
    out = np.zeros((x.shape[0], w.shape[0]), np.float32)
    if bias is not None:
        out += bias
    for k in range(x.shape[1]):
        out = out + x[:, k : k + 1] * w[:, k]
    return out


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 11),
    out_features=st.integers(1, 70),
    depth=st.integers(1, 40),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_product_is_the_ordered_sum_bit_for_bit(
    rows: int, out_features: int, depth: int, with_bias: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out_features, depth)).astype(np.float32)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    bias = rng.standard_normal(out_features).astype(np.float32) if with_bias else None
    got = panels.linear(x, panels.pack(w), bias, lanes=1)
    assert got.dtype == np.float32 and got.shape == (rows, out_features)
    assert got.tobytes() == _in_order(x, w, bias).tobytes()
    assert np.allclose(got, x.astype(np.float64) @ w.T + (0 if bias is None else bias), atol=1e-4)


def test_a_row_has_the_same_bits_alone_or_among_others() -> None:
    """A decoding step's member gets the same values whether it is alone (the one-row path,
    two panels at a time) or in a block of four with others (the block path)."""
    rng = np.random.default_rng(1)
    p = panels.pack(rng.standard_normal((100, 384)).astype(np.float32))
    bias = rng.standard_normal(100).astype(np.float32)
    x = rng.standard_normal((9, 384)).astype(np.float32)
    together = panels.linear(x, p, bias, lanes=1)
    for i in range(9):
        alone = panels.linear(x[i : i + 1], p, bias, lanes=1)
        assert alone.tobytes() == together[i : i + 1].tobytes()


def test_panel_ranges_compose_to_the_whole_product() -> None:
    """Any split of the panels (a core's piece) computes exactly its columns of the whole."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((83, 24)).astype(np.float32)  # 6 panels, the last one partial
    p = panels.pack(w)
    for rows in (1, 3, 4, 6):
        x = rng.standard_normal((rows, 24)).astype(np.float32)
        whole = panels.linear(x, p, None, lanes=1)
        for cuts in ([0, 6], [0, 1, 6], [0, 3, 5, 6], [0, 1, 2, 3, 4, 5, 6]):
            out = np.full((rows, 83), np.nan, np.float32)
            for lo, hi in itertools.pairwise(cuts):
                kernels.panel_product(x, p.panels, p.zero_bias, out, lo, hi)
            assert out.tobytes() == whole.tobytes()


def test_large_weights_are_split_over_the_lanes_with_the_same_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the spinning helpers (:mod:`backends.handoff`) the pieces go to the split's
    thread pool: large weights by panels, many rows by rows, small weights not at all."""
    monkeypatch.setattr(handoff, "ENABLED", False)
    rng = np.random.default_rng(3)
    p = panels.pack(rng.standard_normal((6000, 384)).astype(np.float32))  # 9.2 MB: 4 pieces
    x = rng.standard_normal((2, 384)).astype(np.float32)
    splits: list[tuple[int, int | None]] = []
    run = parallel.run_pieces

    def spy(piece: Any, items: Any, lanes: int | None = None) -> None:
        splits.append((len(items), lanes))
        run(piece, items, lanes)

    monkeypatch.setattr(parallel, "run_pieces", spy)
    one = panels.linear(x, p, None, lanes=1)
    assert splits == []  # one lane: one call on the caller's thread
    two = panels.linear(x, p, None, lanes=2)
    assert splits == [(p.panels.nbytes // panels.PIECE_BYTES, 2)]
    assert one.tobytes() == two.tobytes()
    small = panels.pack(rng.standard_normal((384, 384)).astype(np.float32))  # 0.6 MB
    panels.linear(x, small, None, lanes=2)
    assert len(splits) == 1  # too small to hand pieces to other cores
    many = rng.standard_normal((37, 384)).astype(np.float32)  # a prompt's rows: split by rows
    by_rows = panels.linear(many, small, None, lanes=3)
    assert splits[1:] == [(3, 3)]
    assert by_rows.tobytes() == panels.linear(many, small, None, lanes=1).tobytes()


def test_with_helpers_smaller_weights_are_split_with_the_same_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the spinning helpers a hand-over is cheap: weights from 256 KiB on are split by
    panels (at most 16 pieces), a prompt's many rows of a small weight by rows; the
    values are those of one lane, bit for bit."""
    monkeypatch.setattr(handoff, "ENABLED", True)
    rng = np.random.default_rng(6)
    jobs: list[list[tuple[int, int, int, int]]] = []
    product = handoff.HELPERS.product

    def spy(*args: Any) -> bool:
        jobs.append([tuple(int(v) for v in part) for part in args[4]])
        return product(*args)

    monkeypatch.setattr(handoff.HELPERS, "product", spy)
    x = rng.standard_normal((2, 384)).astype(np.float32)
    for out_features, pieces in ((384, 2), (1536, 9), (6000, 16), (100, 1)):
        p = panels.pack(rng.standard_normal((out_features, 384)).astype(np.float32))
        jobs.clear()
        two = panels.linear(x, p, None, lanes=2)
        assert [len(parts) for parts in jobs] == ([pieces] if pieces > 1 else [])
        assert two.tobytes() == panels.linear(x, p, None, lanes=1).tobytes()
        if jobs:
            assert jobs[0][0][2] == 0 and jobs[0][-1][3] == p.panels.shape[0]
    small = panels.pack(rng.standard_normal((100, 384)).astype(np.float32))
    many = rng.standard_normal((37, 384)).astype(np.float32)
    jobs.clear()
    by_rows = panels.linear(many, small, None, lanes=3)
    assert jobs == [[(0, 12, 0, 7), (12, 24, 0, 7), (24, 37, 0, 7)]]
    assert by_rows.tobytes() == panels.linear(many, small, None, lanes=1).tobytes()
    jobs.clear()
    wide = panels.linear(many[:32], small, None, lanes=12)  # more lanes than groups of 4 rows
    assert [len(parts) for parts in jobs] == [8]  # no empty group
    assert wide.tobytes() == panels.linear(many[:32], small, None, lanes=1).tobytes()


def test_a_caller_that_finds_the_helpers_busy_uses_the_pools_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When another caller holds the helpers' board, the product goes to the thread pool
    cut as the pool cuts it (a weight under 4 MiB: one call), with the same values."""
    monkeypatch.setattr(handoff, "ENABLED", True)
    rng = np.random.default_rng(7)
    p = panels.pack(rng.standard_normal((1536, 384)).astype(np.float32))  # 2.4 MB
    x = rng.standard_normal((2, 384)).astype(np.float32)
    splits: list[int] = []
    run = parallel.run_pieces

    def spy(piece: Any, items: Any, lanes: int | None = None) -> None:
        splits.append(len(items))
        run(piece, items, lanes)

    monkeypatch.setattr(parallel, "run_pieces", spy)
    with handoff.HELPERS._holder:
        busy = panels.linear(x, p, None, lanes=2)
    assert splits == [1]
    assert busy.tobytes() == panels.linear(x, p, None, lanes=1).tobytes()


def _halves(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 values that are all halves: any finite bits, subnormals and signed zeros
    included, a tenth of them small (the magnitudes of a checkpoint's weights)."""
    bits = rng.integers(0, 1 << 16, shape, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x83FF  # inf and NaN exponents: to subnormals
    w = bits.view(np.float16)
    small = (w * np.float16(2.0**-14)).astype(np.float16)  # halves again (rounded)
    return np.where(rng.random(shape) < 0.9, small, w).astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 11),
    out_features=st.integers(1, 70),
    depth=st.integers(1, 40),
    lanes=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_a_weight_of_halves_is_packed_as_halves_with_the_same_products(
    rows: int, out_features: int, depth: int, lanes: int, seed: int
) -> None:
    """Where the CPU converts halves (F16C) a weight whose values are all halves is stored as
    their bits, half the bytes, and every product has the float32 panels' bits."""
    rng = np.random.default_rng(seed)
    w = _halves(rng, (out_features, depth))
    x = rng.standard_normal((rows, depth)).astype(np.float32) * np.float32(2.0**8)
    bias = rng.standard_normal(out_features).astype(np.float32)
    p, full = panels.pack(w), panels.pack(w, halves=False)
    assert p.halves == HALVES and not full.halves
    assert p.panels.nbytes == full.panels.nbytes // (2 if HALVES else 1)
    assert panels.unpack(p).tobytes() == w.tobytes()
    ids = rng.integers(0, out_features, 5)
    assert panels.rows(p, ids).tobytes() == w[ids].tobytes()
    want = _in_order(x, w, bias)
    assert panels.linear(x, full, bias, lanes=1).tobytes() == want.tobytes()
    assert panels.linear(x, p, bias, lanes=lanes).tobytes() == want.tobytes()


def test_halves_are_split_over_cores_with_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight of halves large enough to be cut goes to the helpers and to the pool's
    pieces (another caller holding the helpers) with the one-call bits."""
    rng = np.random.default_rng(7)
    w = _halves(rng, (6000, 384))
    p = panels.pack(w)
    x = rng.standard_normal((3, 384)).astype(np.float32)
    one = panels.linear(x, panels.pack(w, halves=False), None, lanes=1)
    assert panels.linear(x, p, None, lanes=2).tobytes() == one.tobytes()
    monkeypatch.setattr(handoff, "ENABLED", False)
    assert panels.linear(x, p, None, lanes=2).tobytes() == one.tobytes()


@pytest.mark.parametrize(
    "odd",
    [np.float32(1 + 2.0**-12), np.float32(70000.0), np.float32(1e-9), np.float32(np.nan)],
)
def test_a_weight_with_one_value_no_half_holds_stays_float32(odd: np.float32) -> None:
    """One value that is not a half (too precise, out of range, under the smallest
    subnormal, NaN) keeps the whole weight float32: the products never round."""
    w = _halves(np.random.default_rng(8), (37, 5))
    w[20, 3] = odd
    p = panels.pack(w)
    assert not p.halves and p.panels.dtype == np.float32
    assert np.array_equal(panels.unpack(p), w, equal_nan=True)


def test_halves_are_refused_where_the_cpu_cannot_convert_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without F16C (or with numba compiling for another CPU) asking for halves is an error,
    and the default packs float32: the kernels were not compiled for halves there."""
    monkeypatch.setattr(panels, "HALVES", False)
    w = _halves(np.random.default_rng(9), (37, 5))
    with pytest.raises(ValueError, match="half conversion"):
        panels.pack(w, halves=True)
    assert not panels.pack(w).halves and not panels.pack(w, halves=False).halves


def test_rows_unpack_and_shapes() -> None:
    rng = np.random.default_rng(4)
    w = rng.standard_normal((37, 5)).astype(np.float32)
    p = panels.pack(w)
    assert p.shape == (37, 5) and p.panels.shape == (3, 5, panels.PANEL)
    assert np.array_equal(panels.unpack(p), w)
    assert np.array_equal(panels.rows(p, np.array([36, 0, 17, 17])), w[[36, 0, 17, 17]])
    with pytest.raises(IndexError):
        panels.rows(p, np.array([37]))
    with pytest.raises(IndexError):
        panels.rows(p, np.array([-1]))
    with pytest.raises(ValueError, match="weight"):
        panels.pack(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="rows"):
        panels.linear(np.zeros((2, 4), np.float32), p)
    with pytest.raises(ValueError, match="bias"):
        panels.linear(np.zeros((2, 5), np.float32), p, np.zeros(36, np.float32))
    assert panels.linear(np.zeros((0, 5), np.float32), p).shape == (0, 37)


@pytest.mark.parametrize(
    ("bias_len", "out_shape", "lo", "hi"),
    [(47, (2, 37), 0, 3), (48, (3, 37), 0, 3), (48, (2, 49), 0, 3), (48, (2, 32), 0, 3),
     (48, (2, 37), -1, 3), (48, (2, 37), 0, 4)],
)  # fmt: skip
def test_the_kernel_refuses_operands_that_do_not_fit(
    bias_len: int, out_shape: tuple[int, int], lo: int, hi: int
) -> None:
    """Wrong sizes are refused before anything is read or written (the loops do not check)."""
    p = panels.pack(np.ones((37, 5), np.float32))
    x = np.ones((2, 5), np.float32)
    out = np.zeros(out_shape, np.float32)
    with pytest.raises(ValueError, match="panel_product"):
        kernels.panel_product(x, p.panels, np.zeros(bias_len, np.float32), out, lo, hi)
    assert not out.any()


def test_where_numba_compiles_for_another_cpu_weights_stay_float32() -> None:
    """With numba compiling for a generic x86-64 (no F16C), a half's conversion would be a
    call numba does not link (it crashed the process): there no kernel takes halves, and
    a weight of halves is packed float32 with the same products."""
    code = (
        "import numpy as np\n"
        "from backends import intrinsics, panels\n"
        "w = np.arange(-40, 40, dtype=np.float16).reshape(16, 5).astype(np.float32)\n"
        "p = panels.pack(w)\n"
        "x = np.ones((1, 5), np.float32)\n"
        "print(intrinsics.HALVES, p.halves, panels.linear(x, p).sum())\n"
    )
    env = {**os.environ, "NUMBA_CPU_NAME": "generic"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    w = np.arange(-40, 40, dtype=np.float16).reshape(16, 5).astype(np.float32)
    want = panels.linear(np.ones((1, 5), np.float32), panels.pack(w, halves=False)).sum()
    assert done.stdout.split() == ["False", "False", str(want)]
