"""Piper's text encoder on the numpy backend's fast path (``text_encoder.encode_host``)
against the backend-op path (``text_encoder.encode``): the relative-position attention
on its diagonals, the fused convs, and where the model runs it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import parallel
from backends.numpy_backend import NumpyBackend
from backends.piper import PiperModel, load_model, text_encoder
from backends.piper import model as piper_model

BE = NumpyBackend()
REL = 2e-5
"""Largest difference of the two paths relative to an output's largest value (float32 sums
in another order, Q's scale folded into its weights; 1.2e-6 to 1.6e-6 measured on Piper's
weights)."""


@pytest.fixture(scope="module")
def model() -> PiperModel:
    return load_model()


@given(t=st.integers(1, 14), window=st.integers(0, 5), data=st.data())
@settings(max_examples=60, deadline=None)
def test_diagonals_are_views_of_each_offset(t: int, window: int, data: st.DataObject) -> None:
    """_diagonals yields, for every offset within the window that a [t, t] matrix has, a view
    of exactly ``m[i, i + d]`` over the rows it names, and writes through it land there."""
    m = np.arange(t * t, dtype=np.float32).reshape(t, t)
    seen = []
    for d, diagonal, rows in text_encoder._diagonals(m, window):
        seen.append(d)
        i = np.arange(t)[rows]
        assert np.array_equal(diagonal, m[i, i + d])
        assert np.shares_memory(diagonal, m)
    assert seen == [d for d in range(-window, window + 1) if abs(d) < t]
    d = data.draw(st.sampled_from(seen))
    before = m.copy()
    for offset, diagonal, _ in text_encoder._diagonals(m, window):
        if offset == d:
            diagonal += 1000
    i = np.arange(0, t - d) if d >= 0 else np.arange(-d, t)
    changed = np.argwhere(m != before)
    assert sorted(map(tuple, changed)) == sorted((int(r), int(r + d)) for r in i)


def _attention_by_skew(
    qkv: np.ndarray, n_heads: int, rel_k: np.ndarray, rel_v: np.ndarray
) -> np.ndarray:
    """The backend-op path's relative attention (``_relative_attention`` without its convs):
    [3C, T] (Q scaled) -> [C, T]."""
    c, t = qkv.shape[0] // 3, qkv.shape[1]
    dk, window = c // n_heads, (rel_k.shape[0] - 1) // 2

    def heads(x: np.ndarray) -> np.ndarray:
        return text_encoder._heads(BE, x[None], n_heads)

    q, k, v = heads(qkv[:c]), heads(qkv[c : 2 * c]), heads(qkv[2 * c :])
    scores = BE.matmul(q, BE.transpose(k, (0, 1, 3, 2)))
    ek = text_encoder._relative_embeddings(BE, rel_k[None], window, t)
    logits = BE.matmul(q, BE.transpose(BE.reshape(ek, (1, 1, 2 * t - 1, dk)), (0, 1, 3, 2)))
    p = BE.softmax(BE.add(scores, text_encoder._relative_to_absolute(BE, logits)), -1)
    ev = BE.reshape(text_encoder._relative_embeddings(BE, rel_v[None], window, t), (1, 1, -1, dk))
    out = BE.add(BE.matmul(p, v), BE.matmul(text_encoder._absolute_to_relative(BE, p), ev))
    return np.asarray(BE.reshape(BE.transpose(out, (0, 1, 3, 2)), (c, t)))


@given(
    t=st.integers(1, 20),
    window=st.integers(0, 4),
    n_heads=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_attention_on_diagonals_matches_the_skewed_matrices(
    t: int, window: int, n_heads: int, seed: int
) -> None:
    """_attend (scores and weights touched only on the window's diagonals) gives the skewed
    [T, 2T - 1] path's output, for sequences shorter and longer than the window."""
    rng = np.random.default_rng(seed)
    c = 4 * n_heads
    qkv = rng.standard_normal((3 * c, t), dtype=np.float32)
    rel_k = rng.standard_normal((2 * window + 1, c // n_heads), dtype=np.float32)
    rel_v = rng.standard_normal((2 * window + 1, c // n_heads), dtype=np.float32)
    out = np.full((c, t), np.nan, np.float32)
    for head in range(n_heads):
        text_encoder._attend(qkv, head, n_heads, rel_k, rel_v, out)
    want = _attention_by_skew(qkv, n_heads, rel_k, rel_v)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t", [1, 2, 4, 5, 6, 41, 130])
def test_host_encoder_matches_the_backend_ops(model: PiperModel, t: int) -> None:
    """encode_host on Piper's own weights gives encode's (x, m, logs) within REL, for
    sentences shorter than the attention window and longer; shapes [1, C, T]."""
    assert model.prepared is not None
    ids = np.random.default_rng(t).integers(0, model.hyper.n_vocab, t)
    want = text_encoder.encode(BE, model.weights, model.hyper, ids)
    got = text_encoder.encode_host(model.prepared.convs, model.weights, model.hyper, ids)
    for a, b in zip(got, want, strict=True):
        b = np.asarray(b)
        assert a.shape == b.shape and a.dtype == np.float32
        assert np.abs(a - b).max() <= REL * np.abs(b).max()


def test_qkv_is_one_conv_with_q_scaled(model: PiperModel) -> None:
    """prepare_encoder fuses Q, K and V into one conv, Q's rows (bias too) scaled by
    1/sqrt(dk)."""
    assert model.prepared is not None
    h, w = model.hyper, model.weights
    p = "enc_p.encoder.attn_layers.3"
    cw = model.prepared.convs[f"{p}.conv_qkv"]
    c, scale = h.hidden, 1.0 / math.sqrt(h.hidden // h.n_heads)
    assert cw.taps.shape == (1, 3 * c, c) and cw.bias.shape == (3 * c, 1)
    np.testing.assert_allclose(cw.taps[0, :c], w[f"{p}.conv_q.weight"][:, :, 0] * scale, rtol=1e-6)
    np.testing.assert_array_equal(cw.taps[0, c:], np.concatenate(
        [w[f"{p}.conv_k.weight"][:, :, 0], w[f"{p}.conv_v.weight"][:, :, 0]]
    ))  # fmt: skip
    np.testing.assert_allclose(cw.bias[:c, 0], w[f"{p}.conv_q.bias"] * scale, rtol=1e-6)


def test_the_model_encodes_on_the_fast_path_on_one_core(
    model: PiperModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PiperModel on the numpy backend runs encode_host, never the backend-op encoder, with
    no split over the cores whatever the share (inside it a split runs in order) and the
    BLAS held at one thread; only its convs' row pieces get the caller's share as lanes
    (the helpers): the encoder's bits are the same at every share."""
    from backends.piper import host

    seen: list[tuple[int, int, object]] = []
    outputs: list[tuple[np.ndarray, ...]] = []
    real_host = text_encoder.encode_host

    def spy(*args: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        blas = parallel.SHARE._control()
        threads = 0 if blas is None else blas.num_threads
        seen.append((parallel.SHARE.share(), threads, args[4]))
        outputs.append(real_host(*args))  # type: ignore[arg-type]
        return outputs[-1]  # type: ignore[return-value]

    monkeypatch.setattr(piper_model, "encode_host", spy)
    monkeypatch.setattr(piper_model, "encode", lambda *a: pytest.fail("backend-op encoder"))
    ids = np.random.default_rng(7).integers(0, model.hyper.n_vocab, 300)  # several tiles
    share_now = parallel.SHARE
    for share in (3, 1):
        monkeypatch.setattr(
            share_now, "share", lambda n=share: 1 if share_now.in_piece() else n
        )  # the process's share object, as the other tests patch it
        model.latent(BE, piper_model.SynthesisInput(ids, 0.667, 1.0, 0.0, np.random.default_rng(0)))
    monkeypatch.undo()
    assert [(s, lanes) for s, _, lanes in seen] == [(1, 3), (1, 1)]
    assert all(threads in (0, 1) for _, threads, _ in seen)
    assert host.is_host(BE)
    for a, b in zip(*outputs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_every_encoder_conv_has_two_row_pieces(model: PiperModel) -> None:
    """The text encoder's convs (QKV, output, FFN, stats) are prepared in two row pieces for
    the caller's lanes (:func:`backends.piper.host.add_conv`); the flow's and decoder's not."""
    assert model.prepared is not None
    for name, cw in model.prepared.convs.items():
        if name.startswith("enc_p."):
            assert cw.rows is not None and cw.rows.shape == (2, 2), name
        else:
            assert cw.rows is None, name


def test_the_ffn_convs_keep_per_tap_products(model: PiperModel) -> None:
    """The encoder's FFN convs (192 <-> 768, 3 taps) are wide enough for Winograd's filters
    but are prepared without them (42 MB for no measured gain); the flow's in-layers take
    F(4, 5)."""
    assert model.prepared is not None
    convs = model.prepared.convs
    for i in range(model.hyper.n_layers):
        for n in (1, 2):
            cw = convs[f"enc_p.encoder.ffn_layers.{i}.conv_{n}"]
            assert cw.taps.shape[0] == 3 and cw.winograd is None
    f = convs["flow.flows.0.enc.in_layers.0"].winograd
    assert f is not None and (f.transform.m, f.transform.r) == (4, 5)
