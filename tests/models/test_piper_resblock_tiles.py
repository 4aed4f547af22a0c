"""A HiFi-GAN stage's ResBlock2s in compiled tiles (backends.piper.resblock_tiles): the bits
of the Python tiles at every share, tile size and gap layout, on Piper's own weights too;
what it refuses, and where it does not apply."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from backends import parallel
from backends.piper import blas, host, resblock_tiles

pytestmark = [
    pytest.mark.usefixtures("one_blas_thread"),
    pytest.mark.skipif(not blas.ADDRESS, reason="numpy's BLAS takes 32-bit integers here"),
]

Blocks = list[tuple[host.ConvWeights, host.ConvWeights]]


def _blocks(
    rng: np.random.Generator, c: int, kernels: Sequence[tuple[int, tuple[int, int]]]
) -> Blocks:
    return [
        (
            host.prepare(rng.standard_normal((c, c, k), dtype=np.float32) * 0.2,
                         rng.standard_normal(c, dtype=np.float32), d1, fewer_products=False),
            host.prepare(rng.standard_normal((c, c, k), dtype=np.float32) * 0.2,
                         rng.standard_normal(c, dtype=np.float32), d2, fewer_products=False),
        )
        for k, (d1, d2) in kernels
    ]  # fmt: skip


PIPER = ((3, (1, 2)), (5, (2, 6)), (7, (3, 12)))


def _both(
    x: np.ndarray, blocks: Blocks, gaps: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> tuple[np.ndarray, np.ndarray]:
    """The stage through the Python tiles and through the compiled ones (checked to run)."""
    packed = resblock_tiles.pack(blocks)
    assert packed is not None
    tiles: list[int] = []
    run = resblock_tiles.run
    monkeypatch.setattr(resblock_tiles, "run", lambda *a: tiles.append(run(*a)) or tiles[-1])
    outs = []
    for compiled in (False, True):
        monkeypatch.setattr(host, "USE_COMPILED_TILES", compiled)
        out = np.full_like(x, np.nan)
        host.resblocks(x.copy(), blocks, out, slope=0.1, post_slope=0.01, gaps=gaps, packed=packed)
        outs.append(out)
        assert bool(tiles) == compiled
    assert sum(tiles) == -(-x.shape[1] // host._tile_columns(x.shape[1], x.shape[0]))
    return outs[0], outs[1]


@pytest.mark.parametrize("share", [1, 2, 3])
@pytest.mark.parametrize(
    ("c", "t", "gaps", "taps_tile"),
    [
        (6, 900, [(300, 340), (700, 760)], 6 * 128),  # many tiles, gaps across tile edges
        (6, 900, [(0, 40), (860, 900)], 1 << 22),  # one tile, gaps at both ends
        (16, 5, [], 1 << 22),  # shorter than the halos
        (32, 2000, [(1000, 1064)], 32 * 300),  # a last tile shorter than the others
    ],
)
def test_compiled_tiles_give_the_bits_of_the_python_tiles(
    share: int, c: int, t: int, gaps: list[tuple[int, int]], taps_tile: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(host, "TAPS_TILE", taps_tile)
    monkeypatch.setattr(host, "MIN_TILE", 64)
    monkeypatch.setattr(host, "MIN_SPLIT_TILE", 64)
    monkeypatch.setattr(parallel.SHARE, "share", lambda: share)
    rng = np.random.default_rng(c * t + share)
    x = rng.standard_normal((c, t), dtype=np.float32)
    python, compiled = _both(x, _blocks(rng, c, PIPER), gaps, monkeypatch)
    assert not np.isnan(compiled).any()
    assert np.array_equal(python, compiled)


def test_a_whole_request_is_the_same_bits_with_compiled_tiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Piper's own voice: every stage packed, and a request's samples equal either way."""
    from backends.piper import PiperRequest, load_factory

    factory = load_factory()
    prepared = factory.model.prepared
    assert prepared is not None
    assert sorted(prepared.stages) == [0, 1, 2]
    assert all(p is not None for p in prepared.stages.values())
    session = factory.create()
    request = PiperRequest("Tiles without the lock.", noise_w=0.0, seed=3)
    runs = []
    for compiled in (False, True):
        monkeypatch.setattr(host, "USE_COMPILED_TILES", compiled)
        runs.append(np.asarray(session.run(request).audio))
    assert runs[0].size > 10_000
    assert np.array_equal(runs[0], runs[1])


def test_lanes_share_the_tiles_through_the_counter() -> None:
    """Each tile runs once: a second call on a spent counter runs none and writes nothing."""
    rng = np.random.default_rng(1)
    blocks = _blocks(rng, 8, PIPER)
    packed = resblock_tiles.pack(blocks)
    assert packed is not None
    x = rng.standard_normal((8, 1000), dtype=np.float32)
    out = np.zeros_like(x)
    counter = np.zeros(1, np.int64)
    gaps = np.zeros((0, 2), np.int64)
    buffers = resblock_tiles.scratch(packed, 300, 1000)
    assert resblock_tiles.run(x, packed, out, 0.1, 0.01, gaps, 300, counter, buffers) == 4
    before = out.copy()
    assert resblock_tiles.run(x, packed, out, 0.1, 0.01, gaps, 300, counter, buffers) == 0
    assert np.array_equal(out, before) and counter[0] >= 4


def test_a_tile_wider_than_any_input_is_one_tile() -> None:
    """The tile count cannot overflow: a tile of 2**63 - 1 columns runs the input once."""
    rng = np.random.default_rng(4)
    packed = resblock_tiles.pack(_blocks(rng, 8, PIPER))
    assert packed is not None
    x = rng.standard_normal((8, 300), dtype=np.float32)
    gaps = np.zeros((0, 2), np.int64)
    outs = []
    for tile in (300, 2**63 - 1):
        out = np.full_like(x, np.nan)
        buffers = resblock_tiles.scratch(packed, tile, 300)
        counter = np.zeros(1, np.int64)
        assert resblock_tiles.run(x, packed, out, 0.1, 0.01, gaps, tile, counter, buffers) == 1
        outs.append(out)
    assert not np.isnan(outs[1]).any() and np.array_equal(outs[0], outs[1])


def _refused(**change: Any) -> None:
    rng = np.random.default_rng(2)
    packed = resblock_tiles.pack(_blocks(rng, 8, PIPER))
    assert packed is not None
    x = rng.standard_normal((8, 500), dtype=np.float32)
    args: dict[str, Any] = {
        "x": x,
        "packed": packed,
        "out": np.zeros_like(x),
        "slope": 0.1,
        "post_slope": 0.01,
        "gaps": np.zeros((0, 2), np.int64),
        "tile": 200,
        "counter": np.zeros(1, np.int64),
        "buffers": resblock_tiles.scratch(packed, 200, 500),
    }
    args.update(change)
    with pytest.raises(ValueError, match=r"resblock_tiles\.run"):
        resblock_tiles.run(**args)


def test_run_refuses_operands_it_would_read_or_write_out_of_bounds() -> None:
    rng = np.random.default_rng(3)
    packed = resblock_tiles.pack(_blocks(rng, 8, PIPER))
    assert packed is not None
    x = rng.standard_normal((8, 500), dtype=np.float32)
    _refused(buffers=resblock_tiles.scratch(packed, 100, 500))  # made for smaller tiles
    _refused(out=np.zeros((8, 499), np.float32))
    _refused(buffers=resblock_tiles.scratch(packed, 200, 150))  # made for a shorter input
    _refused(x=np.asfortranarray(x))
    _refused(gaps=np.array([[490, 510]], np.int64))  # past the end
    _refused(gaps=np.array([[10, 5]], np.int64))
    _refused(counter=np.zeros(2, np.int64))
    _refused(counter=np.full(1, -1, np.int64))  # its first tile would start before out
    _refused(x=rng.standard_normal((4, 500), dtype=np.float32), out=np.zeros((4, 500), np.float32))
    shared = np.zeros((8, 500), np.float32)
    _refused(x=shared, out=shared)
    _refused(tile=0)
    xa, y, ya = resblock_tiles.scratch(packed, 200, 500)
    _refused(buffers=(xa, y, y))  # a block's output and its activation in one buffer
    whole = np.zeros(xa.size + y.size - 1, np.float32)  # their last and first float shared
    _refused(buffers=(whole[: xa.size].reshape(xa.shape), whole[-y.size :].reshape(y.shape), ya))


def test_pack_leaves_other_convs_to_the_python_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """None for Winograd's filters, row pieces, even kernels, non-square convs and a 32-bit
    BLAS."""
    rng = np.random.default_rng(4)
    assert resblock_tiles.pack(_blocks(rng, 8, PIPER)) is not None
    assert resblock_tiles.pack([]) is None
    w = rng.standard_normal((256, 256, 3), dtype=np.float32)
    fewer = host.prepare(w, None, 1)  # 256 x 256 undilated: Winograd's
    assert fewer.winograd is not None
    plain = _blocks(rng, 256, ((3, (1, 2)),))[0]
    assert resblock_tiles.pack([(fewer, plain[1])]) is None
    rows = host.prepare(w, None, 2, row_pieces=True)
    assert rows.rows is not None
    assert resblock_tiles.pack([(plain[0], rows)]) is None
    even = _blocks(rng, 8, ((4, (1, 2)),))  # its windows would run past the buffers
    assert resblock_tiles.pack(even) is None
    wide = host.prepare(rng.standard_normal((16, 8, 3), dtype=np.float32), None, 1)
    narrow = _blocks(rng, 8, ((3, (1, 2)),))[0]
    assert resblock_tiles.pack([(narrow[0], wide)]) is None
    monkeypatch.setattr(blas, "ADDRESS", 0)
    assert resblock_tiles.pack(_blocks(rng, 8, PIPER)) is None
