"""A flow coupling in compiled tiles (backends.piper.coupling_tiles): the bits of the Python
tiles on several cores, the conv-by-conv values on one (one tile over the input), on
Piper's own weights too; what it refuses, and where it does not apply."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends import parallel
from backends.piper import blas, coupling_tiles, flow, host, winograd
from tests.models.test_piper_convs import TOL, _flow_case, _outside

pytestmark = [
    pytest.mark.usefixtures("one_blas_thread"),
    pytest.mark.skipif(not blas.ADDRESS, reason="numpy's BLAS takes 32-bit integers here"),
]


def _case(t: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, np.ndarray, Any, Any]:
    """A small random flow whose in-layers take F(4, 5) (as Piper's do), and its couplings
    packed."""
    monkeypatch.setattr(winograd, "MIN_CHANNELS_PRODUCT", 1)
    h, prep, z, gaps = _flow_case(t)
    packed = flow.prepare_couplings(prep, h)
    assert all(p is not None for p in packed.values())
    return h, prep, z, gaps, packed


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The tiles each compiled call ran."""
    tiles: list[int] = []
    real = coupling_tiles.run

    def run(*args: Any) -> int:
        tiles.append(real(*args))
        return tiles[-1]

    monkeypatch.setattr(coupling_tiles, "run", run)
    return tiles


@pytest.mark.parametrize("cores", [2, 3])
@pytest.mark.parametrize("t", [9, 130, 257, 900])
def test_compiled_couplings_give_the_bits_of_the_python_tiles(
    t: int, cores: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, prep, z, gaps, packed = _case(t, monkeypatch)
    monkeypatch.setattr(flow, "COUPLING_TILE", 8)  # many tiles, some narrower than the halo
    monkeypatch.setattr(parallel.SHARE, "share", lambda: cores)
    tile = flow._coupling_tile(t)
    assert tile is not None
    monkeypatch.setattr(flow, "USE_COMPILED_TILES", False)
    python = flow.flow_reverse_host(prep, h, z.copy(), gaps, packed)
    monkeypatch.setattr(flow, "USE_COMPILED_TILES", True)
    tiles = _spy(monkeypatch)
    compiled = flow.flow_reverse_host(prep, h, z.copy(), gaps, packed)
    assert sum(tiles) == h.flow_layers * -(-t // tile)  # every tile of every coupling, once
    keep = _outside(gaps, t)  # gap columns are garbage either way
    assert np.array_equal(python[:, keep], compiled[:, keep])


@pytest.mark.parametrize("t", [5, 64, 300])
def test_one_core_runs_a_coupling_as_one_tile_with_the_conv_by_conv_values(
    t: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One tile over the whole input (no halo computed twice): the conv-by-conv path's values
    up to float32 rounding (Winograd's blocks start elsewhere)."""
    h, prep, z, gaps, packed = _case(t, monkeypatch)
    monkeypatch.setattr(parallel.SHARE, "share", lambda: 1)
    ref = flow.flow_reverse_host(prep, h, z.copy(), gaps)  # nothing packed: conv by conv
    tiles = _spy(monkeypatch)
    got = flow.flow_reverse_host(prep, h, z.copy(), gaps, packed)
    assert tiles == [1] * h.flow_layers
    keep = _outside(gaps, t)
    np.testing.assert_allclose(got[:, keep], ref[:, keep], atol=TOL, rtol=TOL)


def test_piper_voice_couplings_are_packed_and_a_request_keeps_its_bits_on_two_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Piper's own voice: every coupling packed; a sentence at two cores gives the same
    samples with and without the compiled tiles (the flow in step over channel pieces, the
    default on several cores, within float32 summation order of them)."""
    from threadpoolctl import threadpool_limits

    from backends.piper import PiperRequest, load_factory

    factory = load_factory()
    prepared = factory.model.prepared
    assert prepared is not None
    assert sorted(prepared.couplings) == [f"flow.flows.{i}" for i in (0, 2, 4, 6)]
    assert all(p is not None for p in prepared.couplings.values())
    session = factory.create()
    request = PiperRequest("A flow in tiles, on two cores.", noise_w=0.0, seed=5)
    runs = []
    with threadpool_limits(limits=2, user_api="blas"):
        monkeypatch.setattr(parallel.SHARE, "share", lambda: 2)
        monkeypatch.setattr(flow, "USE_LOCKSTEP", False)
        for compiled in (False, True):
            monkeypatch.setattr(flow, "USE_COMPILED_TILES", compiled)
            runs.append(np.asarray(session.run(request).audio))
        monkeypatch.setattr(flow, "USE_LOCKSTEP", True)
        in_step = np.asarray(session.run(request).audio)
    assert runs[0].size > 10_000
    assert np.array_equal(runs[0], runs[1])
    assert in_step.shape == runs[0].shape
    np.testing.assert_allclose(in_step, runs[0], atol=1e-4)


def _args(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    h, prep, z, gaps, packed = _case(200, monkeypatch)
    return {
        "z": np.ascontiguousarray(z),
        "packed": packed["flow.flows.0"],
        "out": np.empty_like(z),
        "gaps": np.zeros((0, 2), np.int64),
        "tile": 64,
        "counter": np.zeros(1, np.int64),
    }


@pytest.mark.parametrize(
    "change",
    [
        {"out": np.empty((8, 199), np.float32)},
        {"z": np.asfortranarray(np.zeros((8, 200), np.float32))},
        {"z": np.zeros((6, 200), np.float32), "out": np.zeros((6, 200), np.float32)},
        {"gaps": np.array([[190, 210]], np.int64)},
        {"gaps": np.array([[20, 10]], np.int64)},
        {"gaps": np.array([[1, 2, 3]], np.int64)},
        {"counter": np.zeros(1, np.int32)},
        {"counter": np.full(1, -1, np.int64)},  # a tile before out
        {"tile": 0},
    ],
)
def test_run_refuses_operands_it_would_read_or_write_out_of_bounds(
    change: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _args(monkeypatch)
    args.update(change)
    with pytest.raises(ValueError, match=r"coupling_tiles\.run"):
        coupling_tiles.run(**args)
    args = _args(monkeypatch)
    args["out"] = args["z"]
    with pytest.raises(ValueError, match="overlaps"):
        coupling_tiles.run(**args)


def test_pack_leaves_other_couplings_to_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """None without F(4, 5) in-layers, with a pre conv wider than 1 tap, or a 32-bit BLAS."""
    h, prep, z, gaps = _flow_case(200)  # in-layers too narrow for Winograd here
    assert prep["flow.flows.0.enc.in_layers.0"].winograd is None
    assert coupling_tiles.pack(prep, "flow.flows.0", h.flow_wn_layers) is None
    h, prep, z, gaps, packed = _case(200, monkeypatch)
    wide = dict(prep)
    wide["flow.flows.0.pre"] = host.prepare(np.ones((h.hidden, h.inter // 2, 3), np.float32), None)
    assert coupling_tiles.pack(wide, "flow.flows.0", h.flow_wn_layers) is None
    assert coupling_tiles.pack(prep, "flow.flows.0", 0) is None
    monkeypatch.setattr(blas, "ADDRESS", 0)
    assert coupling_tiles.pack(prep, "flow.flows.0", h.flow_wn_layers) is None


def test_without_the_per_tap_paths_the_packed_couplings_are_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, prep, z, gaps, packed = _case(300, monkeypatch)
    monkeypatch.setattr(host, "USE_TAPS", False)
    tiles = _spy(monkeypatch)
    got = flow.flow_reverse_host(prep, h, z.copy(), gaps, packed)
    assert tiles == []
    ref = flow.flow_reverse_host(prep, h, z.copy(), gaps)
    assert np.array_equal(got, ref)


def test_a_models_packed_weights_are_its_only_copy() -> None:
    """The convs the compiled tiles packed read the packed arrays (views), so packing adds
    no second copy of the weights to a loaded model."""
    from backends.piper import load_factory

    model = load_factory().model
    prepared = model.prepared
    assert prepared is not None
    h = model.hyper
    for i in (0, 2, 4, 6):
        packed = prepared.couplings[f"flow.flows.{i}"]
        assert packed is not None
        for j in range(h.flow_wn_layers):
            cw = prepared.convs[f"flow.flows.{i}.enc.in_layers.{j}"]
            assert cw.winograd is not None
            assert np.shares_memory(cw.winograd.u, packed.in_u)
            rs = prepared.convs[f"flow.flows.{i}.enc.res_skip_layers.{j}"]
            assert np.shares_memory(rs.taps, packed.rs_w)
    n_k = len(h.resblock_kernels)
    for i, stage in prepared.stages.items():
        assert stage is not None
        for j in range(n_k):
            for m in (0, 1):
                cw = prepared.convs[f"dec.resblocks.{i * n_k + j}.convs.{m}"]
                assert np.shares_memory(cw.taps, stage.taps)


def test_a_tile_wider_than_any_input_runs_the_whole_input_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tile count cannot overflow: a tile of 2**63 - 1 columns is one tile, as one of T."""
    outs = []
    for tile in (200, 2**63 - 1):
        args = _args(monkeypatch)
        args["tile"] = tile
        args["out"] = np.full_like(args["z"], np.nan)
        assert coupling_tiles.run(**args) == 1
        outs.append(args["out"])
    assert not np.isnan(outs[1]).any() and np.array_equal(outs[0], outs[1])


def test_gaps_past_the_end_are_clipped_as_the_python_tiles_clip_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, prep, z, _, packed = _case(130, monkeypatch)
    monkeypatch.setattr(parallel.SHARE, "share", lambda: 2)
    gaps = [(120, 140)]  # runs 10 columns past the end
    runs = []
    for compiled in (False, True):
        monkeypatch.setattr(flow, "USE_COMPILED_TILES", compiled)
        runs.append(flow.flow_reverse_host(prep, h, z.copy(), gaps, packed))
    assert np.array_equal(runs[0][:, :120], runs[1][:, :120])


def test_an_input_of_no_frames_gives_no_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    h, prep, z, _, packed = _case(40, monkeypatch)
    monkeypatch.setattr(parallel.SHARE, "share", lambda: 1)
    out = flow.flow_reverse_host(prep, h, z[:, :0].copy(), (), packed)
    assert out.shape == (z.shape[0], 0)
