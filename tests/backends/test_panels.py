"""Packed weights and their product (backends/panels.py, kernels.panel_product): the values
of a float32 sum in a fixed order, whatever rows share a call and whichever core computes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import handoff, kernels, panels, parallel


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
