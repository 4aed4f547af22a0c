"""The CTranslate2 reader, the encoder against CTranslate2's, and the erf behind GELU."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from backends import handoff, panels, parallel
from backends.intrinsics import HALVES
from backends.numpy_backend import NumpyBackend
from backends.panels import PackedWeight
from backends.whisper import model
from backends.whisper.ct2_reader import read_ct2_model
from backends.whisper.session import default_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _variable(name: str, array: np.ndarray, dtype_id: int, raw: bytes | None = None) -> bytes:
    data = array.tobytes() if raw is None else raw
    head = _string(name) + struct.pack("<B", array.ndim)
    head += b"".join(struct.pack("<I", d) for d in array.shape)
    return head + struct.pack("<BI", dtype_id, len(data)) + data


def test_reader_decodes_every_dtype_and_alias(tmp_path: Path) -> None:
    f16 = np.array([[1.5, -2.25], [65504.0, 1e-3]], np.float16)
    bf16_values = np.array([1.0, -3.5, 0.15625], np.float32)
    bf16_raw = (bf16_values.view(np.uint32) >> 16).astype("<u2").tobytes()
    body = struct.pack("<I", 6) + _string("TinySpec") + struct.pack("<I", 2) + struct.pack("<I", 5)
    body += _variable("a/f16", f16, 4)
    body += _variable("a/f32", np.arange(3, dtype=np.float32), 0)
    body += _variable("a/bf16", bf16_values, 5, bf16_raw)
    body += _variable("a/i8", np.array(3, np.int8), 1)
    body += _variable("a/i16", np.array([7, -7], np.int16), 2)
    body += struct.pack("<I", 1) + _string("b/tied") + _string("a/f16")
    (tmp_path / "model.bin").write_bytes(body)
    (tmp_path / "config.json").write_text('{"suppress_ids": [1, 2]}')

    m = read_ct2_model(tmp_path)
    assert (m.spec, m.revision, m.config) == ("TinySpec", 2, {"suppress_ids": [1, 2]})
    assert m.get("a/f16").dtype == np.float32
    np.testing.assert_array_equal(m.get("a/f16"), f16.astype(np.float32))
    np.testing.assert_array_equal(m.get("a/bf16"), bf16_values)
    assert m.get("a/i8").shape == () and int(m.get("a/i8")) == 3
    assert m.get("a/i16").tolist() == [7, -7]
    assert m.get("b/tied") is m.get("a/f16")

    (tmp_path / "model.bin").write_bytes(body + b"\0")
    with pytest.raises(ValueError, match="trailing"):
        read_ct2_model(tmp_path)


def test_reader_on_the_packaged_whisper_model() -> None:
    m = read_ct2_model(default_model_dir())
    assert (m.spec, m.revision, len(m.variables)) == ("WhisperSpec", 3, 148)
    assert m.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert m.get("decoder/embeddings/weight").shape == (51864, 384)
    assert m.get("encoder/conv1/weight").shape == (384, 80, 3)
    assert m.get("encoder/layer_3/self_attention/linear_0/weight").dtype == np.float32
    assert int(m.get("encoder/num_heads")) == 6
    assert m.config["suppress_ids_begin"] == [220, 50256]


def test_encoder_matches_ctranslate2() -> None:
    ctranslate2 = pytest.importorskip("ctranslate2")
    be = NumpyBackend()
    weights = model.load_weights(read_ct2_model(default_model_dir()), be)
    rng = np.random.default_rng(0)
    mel = np.clip(rng.standard_normal((1, 80, 3000)) * 0.4, -1.5, 1.5).astype(np.float32)
    ours = model.encode(be, weights, mel)
    ref_model = ctranslate2.models.Whisper(
        str(default_model_dir()), device="cpu", compute_type="float32", intra_threads=1
    )
    ref = np.array(ref_model.encode(ctranslate2.StorageView.from_array(mel)))
    assert ours.shape == ref.shape == (1, 1500, 384)
    assert float(np.max(np.abs(ours - ref))) < 1e-3 * float(np.max(np.abs(ref)))


def test_numpy_gelu_erf_is_accurate() -> None:
    be = NumpyBackend()
    x = np.linspace(-8.0, 8.0, 400_001, dtype=np.float32)
    exact = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x.astype(np.float64)])
    got = be.gelu(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert float(np.max(np.abs(got - exact))) < 2e-6


def test_decoder_step_equals_the_general_path_bit_for_bit() -> None:
    """A one-token step (the fast path: one member, or several with padded rows) gives the
    very hidden states, caches and lengths of the general path (forced here by asking for
    one cross-attention head, which only the general path returns)."""
    be = NumpyBackend()
    weights = model.load_weights(read_ct2_model(default_model_dir()), be)
    rng = np.random.default_rng(1)
    mel = np.clip(rng.standard_normal((2, 80, 3000)) * 0.4, -1.5, 1.5).astype(np.float32)
    encoded = model.encode(be, weights, mel)
    fast = [model.DecoderState(be, weights) for _ in range(3)]
    general = [model.DecoderState(be, weights) for _ in range(3)]
    for m, (a, b) in enumerate(zip(fast, general, strict=True)):
        rows = encoded[m % 2 : m % 2 + 1]
        a.set_memory(rows)
        b.set_memory(rows)
        prompt = np.asarray([[50257, 50362, 50363][: m + 1]], dtype=np.int64)
        model.decode(be, weights, a, prompt)
        model.decode(be, weights, b, prompt)
    for step in range(4):
        tokens = [440 + step, 50364 + step, 13 + step]
        rows = [np.asarray([[t]], dtype=np.int64) for t in tokens]
        for members, pad in ((1, 1), (3, 4)):  # step_logits pads several members only
            got, _ = model._decode(be, weights, fast[:members], rows[:members], (), pad)
            head = ((0, 0),)
            want, _ = model._decode(be, weights, general[:members], rows[:members], head, pad)
            assert np.array_equal(got, want)
            for a, b in zip(fast, general, strict=True):
                assert a.length == b.length
                assert all(np.array_equal(x, y) for x, y in zip(a.self_k, b.self_k, strict=True))
                assert all(np.array_equal(x, y) for x, y in zip(a.self_v, b.self_v, strict=True))


def test_a_decoding_step_runs_its_products_on_one_blas_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a share of two cores a one-member step holds the BLAS at one thread (its small
    products lose on OpenBLAS's threads) and gives the share back after it."""
    from threadpoolctl import ThreadpoolController

    blas = ThreadpoolController().select(user_api="blas")
    be = NumpyBackend()
    weights = model.load_weights(read_ct2_model(default_model_dir()), be)
    state = model.DecoderState(be, weights)
    rng = np.random.default_rng(2)
    state.set_memory(rng.standard_normal((1, 1500, weights.d_model), dtype=np.float32))
    during: list[int] = []
    step = model._step

    def recorded(*args: Any, **kwargs: Any) -> Any:
        during.append(int(blas.info()[0]["num_threads"]))
        return step(*args, **kwargs)

    monkeypatch.setattr(model, "_step", recorded)
    parallel.SHARE.set_threads(2)
    try:
        model.decode(be, weights, state, np.asarray([[50257]], dtype=np.int64))
        after = int(blas.info()[0]["num_threads"])
    finally:
        parallel.SHARE.set_threads(None)
    assert during == [1] and after == 2


def test_decoder_step_weights_are_packed_on_numpy() -> None:
    """On numpy the weights a decoding step multiplies are packed in panels (DecoderLayer),
    the encoder-output projection and the encoder's weights stay arrays; every weight holds
    the checkpoint's values."""
    ct2 = read_ct2_model(default_model_dir())
    weights = model.load_weights(ct2, NumpyBackend())
    for i, layer in enumerate(weights.dec_layers):
        scope = f"decoder/layer_{i}"
        for packed, name in (
            (layer.self_attn.w_in, "self_attention/linear_0"),
            (layer.self_attn.w_out, "self_attention/linear_1"),
            (layer.cross_attn.w_q, "attention/linear_0"),
            (layer.cross_attn.w_out, "attention/linear_2"),
            (layer.ffn.w1, "ffn/linear_0"),
            (layer.ffn.w2, "ffn/linear_1"),
        ):
            assert isinstance(packed, PackedWeight)
            assert packed.halves == HALVES  # the float16 checkpoint's values: all halves
            assert np.array_equal(panels.unpack(packed), ct2.get(f"{scope}/{name}/weight"))
        assert isinstance(layer.cross_attn.w_in, np.ndarray)
    assert isinstance(weights.embedding, PackedWeight)
    assert weights.embedding.halves == HALVES
    assert np.array_equal(panels.unpack(weights.embedding), ct2.get("decoder/embeddings/weight"))
    assert (weights.d_model, weights.vocab_size) == (384, 51864)
    assert isinstance(weights.enc_layers[0].ffn.w1, np.ndarray)


def test_steps_by_halves_have_the_float32_weights_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoder's step weights packed as halves' bits (half the bytes a step reads) give
    every step's logits, one member or three, the bits of the same weights packed float32."""
    be = NumpyBackend()
    ct2 = read_ct2_model(default_model_dir())
    halves = model.load_weights(ct2, be)
    monkeypatch.setattr(panels, "HALVES", False)
    full = model.load_weights(ct2, be)
    assert not full.embedding.halves and halves.embedding.halves == HALVES
    window = np.random.default_rng(6).normal(size=(1, 1500, 384)).astype(np.float32)

    def primed(w: model.WhisperWeights) -> model.DecoderState:
        state = model.DecoderState(be, w)
        state.set_memory(window)
        model.decode(be, w, state, np.asarray([[50257, 50362]], dtype=np.int64))
        return state

    for members in (1, 3):
        a = [primed(halves) for _ in range(members)]
        b = [primed(full) for _ in range(members)]
        for step in range(3):
            tokens = [440 + step + m for m in range(members)]
            got = model.step_logits(be, halves, a, tokens)
            assert got.tobytes() == model.step_logits(be, full, b, tokens).tobytes()


def test_a_steps_members_get_the_bits_they_get_alone() -> None:
    """On numpy a member's logits in a batched step are exactly those of the same step taken
    alone (packed products and per-member attention: no row depends on another)."""
    be = NumpyBackend()
    weights = model.load_weights(read_ct2_model(default_model_dir()), be)
    rng = np.random.default_rng(5)
    windows = rng.normal(size=(3, 1500, weights.d_model)).astype(np.float32)
    prompts = ([50257, 50362], [50257], [50257, 50362, 440])

    def primed(m: int) -> model.DecoderState:
        state = model.DecoderState(be, weights)
        state.set_memory(windows[m : m + 1])
        model.decode(be, weights, state, np.asarray([prompts[m]], dtype=np.int64))
        return state

    tokens = [440, 1002, 13]
    together = model.step_logits(be, weights, [primed(m) for m in range(3)], tokens)
    for m in range(3):
        alone = model.step_logits(be, weights, [primed(m)], [tokens[m]])
        assert alone.tobytes() == together[m : m + 1].tobytes()


def test_windows_are_encoded_one_a_core_with_one_threads_values() -> None:
    """Several windows go to the cores one window each, every window on one BLAS thread: the
    batch's values are exactly one window's on one thread, even where the BLAS would give
    the op-by-op encoder two threads."""
    from threadpoolctl import threadpool_limits

    be = NumpyBackend()
    weights = model.load_weights(read_ct2_model(default_model_dir()), be)
    mel = np.random.default_rng(3).normal(size=(3, 80, 3000)).astype(np.float32)
    pieces: list[bool] = []
    run = parallel.run_pieces

    def spy(piece: Any, items: Any) -> None:
        def marked(item: Any) -> None:
            if items == range(3):  # the windows' split (not the ops' splits inside)
                pieces.append(parallel.SHARE.in_piece())
            piece(item)

        run(marked, items)

    with threadpool_limits(limits=2, user_api="blas"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "run_pieces", spy)
        batch = model.encode(be, weights, mel)
    with threadpool_limits(limits=1, user_api="blas"):
        alone = [model.encode(be, weights, mel[b : b + 1]) for b in range(3)]
    assert batch.shape == (3, 1500, weights.d_model)
    assert batch.tobytes() == np.concatenate(alone, 0).tobytes()
    assert pieces == [True] * 3  # the three windows are pieces of a split over 2 cores


@pytest.mark.parametrize("helpers", [True, False])
def test_a_steps_cross_attention_is_the_same_on_one_core_or_two(
    monkeypatch: pytest.MonkeyPatch, helpers: bool
) -> None:
    """The members (or, with the spinning helpers, each member's heads) of a decoding step
    are pieces on the cores; which core takes a piece never changes its values (each reads
    only its own window's keys and values)."""
    monkeypatch.setattr(handoff, "ENABLED", helpers and handoff.ENABLED)
    rng = np.random.default_rng(2)
    heads, dim, frames, members = 6, 64, 1500, 3

    def window() -> SimpleNamespace:
        kt = [rng.standard_normal((1, heads, dim, frames)).astype(np.float32)]
        v = [rng.standard_normal((1, heads, frames, dim)).astype(np.float32)]
        return SimpleNamespace(cross_kt=kt, cross_v=v)

    states = [window() for _ in range(members)]
    queries = rng.standard_normal((4, heads * dim)).astype(np.float32)
    results = []
    for lanes in (1, 2):
        results.append(model._step_cross_attention(queries, states, 0, 0.125, 4, lanes))
    assert np.array_equal(results[0], results[1])
    assert not results[0][members:].any()  # the padding row stays zero
    for m, state in enumerate(states):
        ctx, _ = model._query_attention_rows(
            queries[m].reshape(1, heads, 1, dim), state.cross_kt[0], state.cross_v[0], 0.125
        )
        assert np.array_equal(ctx[0, 0], results[0][m])


def test_one_token_over_one_window_for_several_rows_and_other_dtypes() -> None:
    """The fused one-token cross-attention keeps what the products did: one window [1, ...]
    serves every token row of a state, and a float64 memory takes the products."""
    be = NumpyBackend()
    weights = model.load_weights(read_ct2_model(default_model_dir()), be)
    rng = np.random.default_rng(3)
    memory = rng.standard_normal((1, 1500, weights.d_model)).astype(np.float32)
    state = model.DecoderState(be, weights, batch=2)
    state.set_memory(memory)
    both = model.decode(be, weights, state, np.asarray([[440], [441]], dtype=np.int64))
    for row, token in enumerate((440, 441)):
        alone = model.DecoderState(be, weights)
        alone.set_memory(memory)
        one = model.decode(be, weights, alone, np.asarray([[token]], dtype=np.int64))
        # two rows against one: their products round apart (4.6e-5 on values up to 80)
        assert np.allclose(both[row], one[0], rtol=1e-4, atol=2e-4)
    wide = model.DecoderState(be, weights)
    wide.set_memory(memory.astype(np.float64))
    out = model.decode(be, weights, wide, np.asarray([[440]], dtype=np.int64))
    assert np.allclose(out, both[:1], rtol=1e-4, atol=1e-4)
