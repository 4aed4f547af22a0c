"""The whole flow in one compiled split, its couplings' steps in step over channel pieces
(backends.piper.coupling_tiles.run_flow): the conv-by-conv values, the same bits on one
core or several, what it refuses, and where it runs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends import parallel
from backends.piper import blas, coupling_tiles, flow, winograd
from tests.models.test_piper_convs import TOL, _flow_case, _outside

pytestmark = [
    pytest.mark.usefixtures("one_blas_thread"),
    pytest.mark.skipif(not blas.ADDRESS, reason="numpy's BLAS takes 32-bit integers here"),
]


def _case(
    t: int, monkeypatch: pytest.MonkeyPatch, inter: int = 8, hidden: int = 6
) -> tuple[Any, Any, np.ndarray, Any, Any, Any]:
    """A small random flow whose in-layers take F(4, 5), its couplings packed and stacked."""
    monkeypatch.setattr(winograd, "MIN_CHANNELS_PRODUCT", 1)
    h, prep, z, gaps = _flow_case(t, inter, hidden)
    packed = flow.prepare_couplings(prep, h)
    stacked = flow.stack_couplings(packed, prep, h)
    assert stacked is not None and stacked.couplings == h.flow_layers
    return h, prep, z, gaps, packed, stacked


def _gaps(gaps: list[tuple[int, int]]) -> np.ndarray:
    return np.array(gaps, np.int64).reshape(-1, 2)


@pytest.mark.parametrize("lanes", [1, 2, 3])
@pytest.mark.parametrize("t", [1, 5, 9, 64, 130, 257])
def test_the_flow_in_step_has_the_conv_by_conv_values(
    t: int, lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any length (shorter than a Winograd block, than a layer's reach, pieces of one block),
    one to three pieces, gaps of a packed batch zeroed before every layer."""
    h, prep, z, gaps, _, stacked = _case(t, monkeypatch)
    ref = flow.flow_reverse_host(prep, h, z.copy(), gaps)  # nothing packed: conv by conv
    got = coupling_tiles.run_flow(z.copy(), stacked, _gaps(gaps), lanes)
    assert got.shape == z.shape and got.dtype == np.float32 and got.flags.c_contiguous
    keep = _outside(gaps, t)
    np.testing.assert_allclose(got[:, keep], ref[:, keep], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("t", [64, 257, 900])
def test_the_pieces_fix_the_bits_whichever_cores_run_them(
    t: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pieces run by one core, one after the other, or by two at once: the same bits
    (each piece's products are its own, whoever claims it), and the input is left as it was."""
    h, prep, z, gaps, _, stacked = _case(t, monkeypatch)
    runs = []
    for cores in (1, 2, 2):
        monkeypatch.setattr(parallel.SHARE, "share", lambda cores=cores: cores)
        given = z.copy()
        runs.append(coupling_tiles.run_flow(given, stacked, _gaps(gaps), 2))
        assert np.array_equal(given, z)
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[1], runs[2])


def test_several_cores_run_the_stacked_flow_and_one_core_the_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, prep, z, gaps, packed, stacked = _case(300, monkeypatch)
    calls: list[int] = []
    real = coupling_tiles.run_flow

    def spy(*args: Any) -> np.ndarray:
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(coupling_tiles, "run_flow", spy)
    for cores in (1, 2):
        monkeypatch.setattr(parallel.SHARE, "share", lambda cores=cores: cores)
        flow.flow_reverse_host(prep, h, z.copy(), gaps, packed, stacked)
    assert calls == [2]
    monkeypatch.setattr(flow, "USE_LOCKSTEP", False)  # tiles with a halo, for comparisons
    flow.flow_reverse_host(prep, h, z.copy(), gaps, packed, stacked)
    assert calls == [2]


@pytest.mark.parametrize(
    "change",
    [
        {"z": np.zeros((6, 50), np.float32)},
        {"z": np.zeros((8, 50), np.float64)},
        {"z": np.zeros((8, 0), np.float32)},
        {"gaps": np.array([[40, 60]], np.int64)},
        {"gaps": np.array([[20, 10]], np.int64)},
        {"gaps": np.array([[1, 2, 3]], np.int64)},
        {"lanes": 0},
    ],
)
def test_run_flow_refuses_what_it_would_read_or_write_out_of_bounds(
    change: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    *_, stacked = _case(50, monkeypatch)
    args: dict[str, Any] = {
        "z": np.zeros((8, 50), np.float32),
        "flow": stacked,
        "gaps": np.zeros((0, 2), np.int64),
        "lanes": 2,
    }
    args.update(change)
    with pytest.raises(ValueError, match=r"coupling_tiles\.run_flow"):
        coupling_tiles.run_flow(**args)


@pytest.mark.parametrize(
    ("t", "lanes", "inter", "hidden"),
    [(17, 4, 8, 6), (13, 3, 8, 6), (5, 2, 8, 6), (1, 4, 8, 6), (9, 7, 8, 6), (20, 5, 16, 2)],
)
def test_no_piece_is_empty(
    t: int, lanes: int, inter: int, hidden: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many lanes on few channels (hidden or half) get fewer pieces, never an empty one
    (whose products would call the BLAS with no rows); every channel is in one piece, and
    the values stay the conv-by-conv ones."""
    h, prep, z, gaps, _, stacked = _case(t, monkeypatch, inter, hidden)
    c, half = stacked.pre_w.shape[1:]
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    real = coupling_tiles._flow_steps

    def spy(*args: Any) -> None:
        seen.append((np.array(args[11]), np.array(args[12])))  # rows' and halves' bounds
        real(*args)

    monkeypatch.setattr(coupling_tiles, "_flow_steps", spy)
    got = coupling_tiles.run_flow(z.copy(), stacked, _gaps(gaps), lanes)
    assert seen
    for rows, halves in seen:
        assert rows[0] == 0 and rows[-1] == c and np.all(np.diff(rows) > 0)
        assert halves[0] == 0 and halves[-1] == half and np.all(np.diff(halves) > 0)
        assert len(rows) == len(halves) == min(lanes, half, c) + 1
    ref = flow.flow_reverse_host(prep, h, z.copy(), gaps)
    np.testing.assert_allclose(got, ref, atol=TOL, rtol=TOL)


@pytest.mark.parametrize(("inter", "hidden"), [(16, 2), (24, 4), (4, 9)])
@pytest.mark.parametrize("lanes", [1, 2, 3, 5])
def test_halves_wider_or_narrower_than_the_hidden_channels(
    inter: int, hidden: int, lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flow whose half is wider than its hidden channels (the post step's pieces are then
    the larger ones) or narrower, on more lanes than either: the conv-by-conv values."""
    h, prep, z, gaps, _, stacked = _case(70, monkeypatch, inter, hidden)
    ref = flow.flow_reverse_host(prep, h, z.copy(), gaps)
    got = coupling_tiles.run_flow(z.copy(), stacked, _gaps(gaps), lanes)
    keep = _outside(gaps, 70)
    np.testing.assert_allclose(got[:, keep], ref[:, keep], atol=TOL, rtol=TOL)


def test_a_flow_of_inconsistent_shapes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    *_, stacked = _case(50, monkeypatch)
    fields = ("pre_w", "pre_b", "in_u", "in_b", "rs_w", "rs_b", "post_w", "post_b")
    arrays = {f: getattr(stacked, f) for f in fields}
    for name, bad in (
        ("rs_w", arrays["rs_w"][..., :-1]),
        ("post_w", np.ascontiguousarray(arrays["post_w"][:, :, :-1])),
        ("in_b", arrays["in_b"].astype(np.float64)),
    ):
        with pytest.raises(ValueError, match=r"coupling_tiles\.Flow"):
            coupling_tiles.Flow(**{**arrays, name: bad})


def test_only_couplings_all_packed_alike_are_stacked(monkeypatch: pytest.MonkeyPatch) -> None:
    h, prep, z, gaps, packed, stacked = _case(50, monkeypatch)
    first = stacked.coupling(0)
    assert coupling_tiles.Flow.stack([]) is None
    narrower = coupling_tiles.Packed(
        **{f: getattr(first, f)[..., :1] if f == "pre_w" else getattr(first, f)
           for f in ("pre_w", "pre_b", "in_u", "in_b", "rs_w", "rs_b", "post_w", "post_b")}
    )  # fmt: skip
    assert coupling_tiles.Flow.stack([first, narrower]) is None
    one_unpacked = {**packed, "flow.flows.0": None}  # (a coupling the tiles do not take)
    assert flow.stack_couplings(one_unpacked, dict(prep), h) is None


def test_a_voices_stacked_flow_is_its_only_copy_of_the_couplings() -> None:
    from backends.piper import load_factory

    model = load_factory().model
    prepared = model.prepared
    assert prepared is not None and prepared.flow is not None
    order = [f"flow.flows.{i}" for i in (6, 4, 2, 0)]  # as the reverse flow runs them
    for k, p in enumerate(order):
        packed = prepared.couplings[p]
        assert packed is not None
        assert np.shares_memory(packed.in_u, prepared.flow.in_u[k])
        cw = prepared.convs[f"{p}.enc.in_layers.0"]
        assert cw.winograd is not None and np.shares_memory(cw.winograd.u, prepared.flow.in_u)
