"""Whisper encoder and decoder on an :class:`~backends.base.ArrayBackend`.

:class:`WhisperWeights` holds the immutable float32 tensors (uploaded once per
backend, shared by every session). :class:`DecoderState` is the private mutable
part of one session: preallocated self-attention KV caches, the cross-attention
keys/values of the current 30 s window, and the cached position.

Layout follows CTranslate2's ``WhisperSpec``: pre-norm transformer blocks; the
self-attention projection is fused ``[q; k; v]`` (``linear_0``), the
cross-attention query is ``linear_0`` and the fused ``[k; v]`` of the encoder
output is ``linear_1``; the output projection shares the token embedding.

On the numpy backend the weights a decoding step multiplies (each decoder layer's but
the encoder-output projection, and the tied embedding as the vocabulary projection)
are packed in panels (:mod:`backends.panels`): a step's few rows read each weight
once, and a row's values do not depend on the rows beside it. Elsewhere the tied
embedding is stored once, transposed (``[d, vocab]``, contiguous): the per-step
vocabulary projection ``h @ E^T`` is then a plain row-major product, and token
lookup gathers columns. Cross-attention keys are stored transposed per window
(``[B, H, D, 1500]``): each query's scores read rows of keys.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs
import numpy as np

from backends import handoff, kernels, panels, parallel
from backends.base import Array, ArrayBackend
from backends.numpy_backend import NumpyBackend
from backends.panels import PackedWeight
from backends.whisper.ct2_reader import Ct2Model

MAX_TARGET_POSITIONS = 448
ROW_MULTIPLE = 4
"""Stacked decoder rows are padded to a multiple of this on backends whose products run
faster so (OpenBLAS, one thread, ran a [M, 384] x [384, 1536] product faster at M = 4
than at 2 or 3); on numpy, whose step products take rows four at a time
(:func:`backends.kernels.panel_product`), the rows are not padded."""


@attrs.frozen
class AttentionWeights:
    norm_g: Array
    norm_b: Array
    w_in: Array  # fused projections, [k*d, d]
    b_in: Array
    w_out: Array
    b_out: Array
    w_q: Array | None = None  # cross attention only: separate query projection
    b_q: Array | None = None


@attrs.frozen
class FfnWeights:
    norm_g: Array
    norm_b: Array
    w1: Array
    b1: Array
    w2: Array
    b2: Array


@attrs.frozen
class EncoderLayer:
    attn: AttentionWeights
    ffn: FfnWeights


@attrs.frozen
class DecoderLayer:
    """A decoder layer's weights, each ``[out, in]``. On the numpy backend those a decoding
    step multiplies (all but the cross-attention's ``w_in``, which projects the encoder's
    1500 rows once a window) are :class:`~backends.panels.PackedWeight`: a step multiplies a
    few rows by each, and OpenBLAS packed the whole weight again on every call of two rows
    or more (a step of two members took twice the time of one)."""

    self_attn: AttentionWeights
    cross_attn: AttentionWeights
    ffn: FfnWeights


@attrs.frozen
class WhisperWeights:
    """Immutable model tensors on one backend, shared by all sessions."""

    conv1_w: Array
    conv1_b: Array
    conv2_w: Array
    conv2_b: Array
    enc_pos: Array
    enc_layers: tuple[EncoderLayer, ...]
    enc_norm_g: Array
    enc_norm_b: Array
    embedding: Array
    """The tied token embedding and vocabulary projection: on numpy ``E [vocab, d]`` packed
    (:class:`~backends.panels.PackedWeight`), elsewhere ``E^T [d, vocab]`` contiguous."""
    dec_pos: Array
    dec_layers: tuple[DecoderLayer, ...]
    dec_norm_g: Array
    dec_norm_b: Array
    enc_heads: int
    dec_heads: int

    @property
    def d_model(self) -> int:
        if isinstance(self.embedding, PackedWeight):
            return self.embedding.in_features
        return int(self.embedding.shape[0])

    @property
    def vocab_size(self) -> int:
        if isinstance(self.embedding, PackedWeight):
            return self.embedding.out_features
        return int(self.embedding.shape[1])

    def arrays(self) -> list[Any]:
        """Every tensor (for memory accounting and sharing checks)."""
        out: list[Any] = []

        def visit(value: Any) -> None:
            if attrs.has(type(value)):
                for field in attrs.fields(type(value)):
                    visit(getattr(value, field.name))
            elif isinstance(value, tuple):
                for item in value:
                    visit(item)
            elif value is not None and not isinstance(value, int):
                out.append(value)

        visit(self)
        return out


def load_weights(model: Ct2Model, backend: ArrayBackend) -> WhisperWeights:
    """Upload the float32 tensors of a CTranslate2 ``WhisperSpec`` model to ``backend``."""
    if model.spec != "WhisperSpec":
        raise ValueError(f"not a Whisper model: spec {model.spec!r}")
    if int(model.get("decoder/activation")) != 3 or not bool(model.get("decoder/pre_norm")):
        raise ValueError("expected a pre-norm GELU Whisper decoder")

    def up(name: str) -> Array:
        return backend.to_device(model.get(name))

    packed = isinstance(backend, NumpyBackend)

    def up_step(name: str) -> Array:
        """A weight a decoding step multiplies (see :class:`DecoderLayer`): packed on numpy."""
        return panels.pack(model.get(name)) if packed else up(name)

    def attention(scope: str, cross: bool, step: Callable[[str], Array] = up) -> AttentionWeights:
        if cross:
            return AttentionWeights(
                norm_g=up(f"{scope}/layer_norm/gamma"),
                norm_b=up(f"{scope}/layer_norm/beta"),
                w_q=step(f"{scope}/linear_0/weight"),
                b_q=up(f"{scope}/linear_0/bias"),
                w_in=up(f"{scope}/linear_1/weight"),
                b_in=up(f"{scope}/linear_1/bias"),
                w_out=step(f"{scope}/linear_2/weight"),
                b_out=up(f"{scope}/linear_2/bias"),
            )
        return AttentionWeights(
            norm_g=up(f"{scope}/layer_norm/gamma"),
            norm_b=up(f"{scope}/layer_norm/beta"),
            w_in=step(f"{scope}/linear_0/weight"),
            b_in=up(f"{scope}/linear_0/bias"),
            w_out=step(f"{scope}/linear_1/weight"),
            b_out=up(f"{scope}/linear_1/bias"),
        )

    def ffn(scope: str, step: Callable[[str], Array] = up) -> FfnWeights:
        return FfnWeights(
            norm_g=up(f"{scope}/layer_norm/gamma"),
            norm_b=up(f"{scope}/layer_norm/beta"),
            w1=step(f"{scope}/linear_0/weight"),
            b1=up(f"{scope}/linear_0/bias"),
            w2=step(f"{scope}/linear_1/weight"),
            b2=up(f"{scope}/linear_1/bias"),
        )

    def count(prefix: str) -> int:
        n = 0
        while f"{prefix}/layer_{n}/ffn/linear_0/weight" in model.variables:
            n += 1
        return n

    enc_layers = tuple(
        EncoderLayer(
            attention(f"encoder/layer_{i}/self_attention", False), ffn(f"encoder/layer_{i}/ffn")
        )
        for i in range(count("encoder"))
    )
    dec_layers = tuple(
        DecoderLayer(
            attention(f"decoder/layer_{i}/self_attention", False, up_step),
            attention(f"decoder/layer_{i}/attention", True, up_step),
            ffn(f"decoder/layer_{i}/ffn", up_step),
        )
        for i in range(count("decoder"))
    )
    return WhisperWeights(
        conv1_w=up("encoder/conv1/weight"),
        conv1_b=up("encoder/conv1/bias"),
        conv2_w=up("encoder/conv2/weight"),
        conv2_b=up("encoder/conv2/bias"),
        enc_pos=up("encoder/position_encodings/encodings"),
        enc_layers=enc_layers,
        enc_norm_g=up("encoder/layer_norm/gamma"),
        enc_norm_b=up("encoder/layer_norm/beta"),
        embedding=(
            panels.pack(model.get("decoder/embeddings/weight"))
            if packed
            else backend.to_device(np.ascontiguousarray(model.get("decoder/embeddings/weight").T))
        ),
        dec_pos=up("decoder/position_encodings/encodings"),
        dec_layers=dec_layers,
        dec_norm_g=up("decoder/layer_norm/gamma"),
        dec_norm_b=up("decoder/layer_norm/beta"),
        enc_heads=int(model.get("encoder/num_heads")),
        dec_heads=int(model.get("decoder/num_heads")),
    )


def _linear(
    be: ArrayBackend, x: Array, w: Array, b: Array | None = None, lanes: int | None = None
) -> Array:
    """``linear`` on a 2-D view: numpy copies a transposed weight for stacked (3-D) matmuls."""
    *lead, d_in = x.shape
    y = _project(be, be.reshape(x, (-1, d_in)), w, b, lanes)
    return be.reshape(y, (*lead, y.shape[-1]))


def _project(
    be: ArrayBackend, x: Array, w: Array, b: Array | None = None, lanes: int | None = None
) -> Array:
    """``x [M, in] @ w.T + b``: :func:`backends.panels.linear` for a packed weight (on up to
    ``lanes`` cores; None: the caller's share), else the backend's ``linear``."""
    if isinstance(w, PackedWeight):
        return panels.linear(x, w, b, lanes)
    return be.linear(x, w, b)


def _token_rows(be: ArrayBackend, w: WhisperWeights, ids: np.ndarray) -> Array:
    """The embedding rows of token ``ids`` [n]: [n, d]."""
    if isinstance(w.embedding, PackedWeight):
        return panels.rows(w.embedding, ids)
    return be.transpose(be.take(w.embedding, ids, axis=1), (1, 0))


def _split_heads(be: ArrayBackend, x: Array, heads: int) -> Array:
    """[B, T, H*D] -> [B, H, T, D]."""
    b, t, d = x.shape
    return be.transpose(be.reshape(x, (b, t, heads, d // heads)), (0, 2, 1, 3))


def _merge_heads(be: ArrayBackend, x: Array) -> Array:
    """[B, H, T, D] -> [B, T, H*D]."""
    b, h, t, d = x.shape
    return be.reshape(be.transpose(x, (0, 2, 1, 3)), (b, t, h * d))


def encode(be: ArrayBackend, w: WhisperWeights, mel: Array) -> Array:
    """Encoder: mel [B, 80, 3000] -> hidden states [B, 1500, d].

    On the numpy backend several windows are encoded one by one, each a piece on the
    caller's share of the cores (:mod:`backends.parallel`: one window a core, each on one
    BLAS thread) rather than each op split over the cores: 4 windows on 2 cores took 0.47 s
    a window that way against 0.57 (one thread: 0.85 against 0.88). A window's values are
    then those of one window on one BLAS thread, whatever the share or the batch. One
    window alone keeps every core for its own ops.
    """
    if mel.shape[0] > 1 and isinstance(be, NumpyBackend):
        windows: list[Array] = [None] * mel.shape[0]

        def window(b: int) -> None:
            windows[b] = _encode(be, w, be.slice(mel, 0, b, b + 1))

        parallel.run_pieces(window, range(mel.shape[0]))
        return be.concat(windows, 0)
    return _encode(be, w, mel)


def _encode(be: ArrayBackend, w: WhisperWeights, mel: Array) -> Array:
    """:func:`encode`'s layers over all of ``mel``'s windows at once."""
    x = be.gelu(be.conv1d(mel, w.conv1_w, w.conv1_b, padding=1))
    x = be.gelu(be.conv1d(x, w.conv2_w, w.conv2_b, stride=2, padding=1))
    x = be.add(be.transpose(x, (0, 2, 1)), w.enc_pos)
    d = w.d_model
    for layer in w.enc_layers:
        a = layer.attn
        h = be.layer_norm(x, a.norm_g, a.norm_b)
        qkv = _linear(be, h, a.w_in, a.b_in)
        q = _split_heads(be, be.slice(qkv, 2, 0, d), w.enc_heads)
        k = _split_heads(be, be.slice(qkv, 2, d, 2 * d), w.enc_heads)
        v = _split_heads(be, be.slice(qkv, 2, 2 * d, 3 * d), w.enc_heads)
        ctx = _merge_heads(be, _attention_per_window(be, q, k, v))
        x = be.add(x, _linear(be, ctx, a.w_out, a.b_out))
        x = be.add(x, _ffn(be, layer.ffn, x))
    return be.layer_norm(x, w.enc_norm_g, w.enc_norm_b)


def _attention_per_window(be: ArrayBackend, q: Array, k: Array, v: Array) -> Array:
    """Self-attention [B, H, T, D] one window at a time (the linear layers around it run on
    all windows at once), so the score blocks stay one window's size (6 x 1500 x 1500
    floats, 54 MB, against 432 MB for 8 windows in one call). Numpy never gets here with
    several windows: :func:`encode` gives it one window a piece."""
    batch = q.shape[0]
    if batch == 1:
        return be.attention(q, k, v)
    parts = [
        be.attention(be.slice(q, 0, b, b + 1), be.slice(k, 0, b, b + 1), be.slice(v, 0, b, b + 1))
        for b in range(batch)
    ]
    return be.concat(parts, 0)


def _ffn(be: ArrayBackend, f: FfnWeights, x: Array, lanes: int | None = None) -> Array:
    h = be.layer_norm(x, f.norm_g, f.norm_b)
    return _linear(be, be.gelu(_linear(be, h, f.w1, f.b1, lanes)), f.w2, f.b2, lanes)


class DecoderState:
    """One session's private decoder memory: KV caches and the current window's cross K/V."""

    def __init__(self, be: ArrayBackend, w: WhisperWeights, batch: int = 1) -> None:
        self._be = be
        self._w = w
        heads = w.dec_heads
        head_dim = w.d_model // heads
        shape = (batch, heads, MAX_TARGET_POSITIONS, head_dim)
        self.self_k = [be.zeros(shape) for _ in w.dec_layers]
        self.self_v = [be.zeros(shape) for _ in w.dec_layers]
        self.cross_kt: list[Array] = []  # [B, H, D, 1500]
        self.cross_v: list[Array] = []
        self.length = 0

    def set_memory(self, encoder_out: Array) -> None:
        """Project the encoder output [B, 1500, d] to each layer's cross keys/values.

        Also resets the caches.
        """
        be, w = self._be, self._w
        d = w.d_model
        self.cross_kt, self.cross_v = [], []
        for layer in w.dec_layers:
            kv = _linear(be, encoder_out, layer.cross_attn.w_in, layer.cross_attn.b_in)
            k = be.reshape(be.slice(kv, 2, 0, d), (kv.shape[0], kv.shape[1], w.dec_heads, -1))
            self.cross_kt.append(be.transpose(k, (0, 2, 3, 1)))
            self.cross_v.append(_split_heads(be, be.slice(kv, 2, d, 2 * d), w.dec_heads))
        self.length = 0

    def clear(self) -> None:
        """Forget the window (cross K/V) and the cached positions."""
        self.cross_kt, self.cross_v = [], []
        self.length = 0

    def nbytes(self) -> int:
        arrays = self.self_k + self.self_v + self.cross_kt + self.cross_v
        return sum(int(np.prod(a.shape)) * 4 for a in arrays)


def decode(be: ArrayBackend, w: WhisperWeights, state: DecoderState, tokens: np.ndarray) -> Array:
    """Run ``tokens`` [B, T] at the next T positions; returns final hidden states [B, T, d].

    Keys/values are appended to ``state``'s caches; later positions attend causally.
    """
    hidden, _ = _decode(be, w, [state], [tokens], ())
    return hidden


def step_logits(
    be: ArrayBackend, w: WhisperWeights, states: Sequence[DecoderState], tokens: Sequence[int]
) -> Array:
    """One token for each of several independent sequences: their next-token logits [M, V].

    Member ``m`` feeds ``tokens[m]`` at the next position of ``states[m]`` (each has
    its own length, caches and window). Every linear layer and the vocabulary
    projection is one product over the stacked rows (off numpy padded with zero rows to
    a multiple of :data:`ROW_MULTIPLE`); attention runs per member, over its own cache
    and window.
    """
    rows = [np.asarray([[token]], dtype=np.int64) for token in tokens]
    pad = ROW_MULTIPLE if len(rows) > 1 and not isinstance(w.embedding, PackedWeight) else 1
    hidden, _ = _decode(be, w, states, rows, (), pad)
    out = logits(be, w, be.reshape(hidden, (hidden.shape[0], w.d_model)))
    return out if out.shape[0] == len(rows) else be.slice(out, 0, 0, len(rows))


def decode_with_cross_attention(
    be: ArrayBackend,
    w: WhisperWeights,
    state: DecoderState,
    tokens: np.ndarray,
    heads: Sequence[tuple[int, int]],
) -> tuple[Array, np.ndarray]:
    """:func:`decode`, also returning the cross-attention scores of ``heads`` ((layer, head) pairs).

    The scores are the scaled query-key products before the softmax, on the host,
    float32 ``[B, len(heads), T, frames]`` in the order of ``heads`` (CTranslate2's
    alignment-head attention, which it requests with unnormalised attention).
    """
    hidden, attention = _decode(be, w, [state], [tokens], heads)
    return hidden, attention[0]


def _join(be: ArrayBackend, parts: Sequence[Array], axis: int) -> Array:
    return parts[0] if len(parts) == 1 else be.concat(parts, axis)


def _rows(be: ArrayBackend, x: Array, spans: Sequence[tuple[int, int]], m: int) -> Array:
    """Member ``m``'s rows of the stacked ``x`` (all of it when there is one member)."""
    lo, hi = spans[m]
    return x if len(spans) == 1 else be.slice(x, 0, lo, hi)


def _decode(
    be: ArrayBackend,
    w: WhisperWeights,
    states: Sequence[DecoderState],
    tokens: Sequence[np.ndarray],
    heads: Sequence[tuple[int, int]],
    pad: int = 1,
) -> tuple[Array, list[np.ndarray]]:
    """Members ``m`` (``tokens[m]`` [B_m, T] after ``states[m]``'s cached positions), stacked.

    Linear layers, norms and the FFN run once over all members' rows (with zero rows
    after them up to a multiple of ``pad``); self- and cross-attention run per member.
    Returns the hidden states [rows, T, d] (the padding rows last) and, per member,
    the scores of ``heads`` (see :func:`decode_with_cross_attention`).
    """
    steps = tokens[0].shape[1]
    if any(t.shape[1] != steps for t in tokens):
        raise ValueError("decoder members must feed the same number of tokens")
    if not heads and all(t.shape == (1, 1) for t in tokens):  # a decoding step
        lanes = parallel.SHARE.share()  # read before _step_products may hold it at one
        with _step_products(be):
            hidden = _step(be, w, states, [int(t[0, 0]) for t in tokens], pad, lanes)
        no_scores = [
            np.zeros((1, 0, 1, s.cross_v[0].shape[2] if s.cross_v else 0), np.float32)
            for s in states
        ]
        return be.reshape(hidden, (hidden.shape[0], 1, w.d_model)), no_scores
    starts = [state.length for state in states]
    if any(start + steps > MAX_TARGET_POSITIONS for start in starts):
        raise ValueError("decoder input exceeds 448 positions")
    spans, total = [], 0
    for t in tokens:
        spans.append((total, total + t.shape[0]))
        total += t.shape[0]
    d, heads_count = w.d_model, w.dec_heads
    scale = 1.0 / math.sqrt(d // heads_count)
    ids = np.concatenate([t.reshape(-1) for t in tokens])
    positions = np.concatenate(
        [np.tile(np.arange(s, s + steps), t.shape[0]) for s, t in zip(starts, tokens, strict=True)]
    )
    x = _token_rows(be, w, ids)
    x = be.reshape(be.add(x, be.take(w.dec_pos, positions, axis=0)), (total, steps, d))
    padding = [be.zeros((-total % pad, steps, d))] if total % pad else []
    x = _join(be, [x, *padding], 0)
    masks: list[Array | None] = []
    for start in starts:
        mask = None
        if steps > 1:
            rows = np.arange(steps)[:, None] + start
            cols = np.arange(start + steps)[None, :]
            mask = be.to_device(np.where(cols > rows, -np.inf, 0.0).astype(np.float32))
        masks.append(mask)
    for layer_index, head in heads:
        if not (0 <= layer_index < len(w.dec_layers) and 0 <= head < heads_count):
            raise ValueError(f"no cross-attention head {head} in decoder layer {layer_index}")
    collected: list[dict[tuple[int, int], np.ndarray]] = [{} for _ in states]
    for i, layer in enumerate(w.dec_layers):
        a = layer.self_attn
        h = be.layer_norm(x, a.norm_g, a.norm_b)
        qkv = _linear(be, h, a.w_in, a.b_in)
        ctxs = []
        for m, state in enumerate(states):
            part, start = _rows(be, qkv, spans, m), starts[m]
            q = _split_heads(be, be.slice(part, 2, 0, d), heads_count)
            k_new = _split_heads(be, be.slice(part, 2, d, 2 * d), heads_count)
            be.write_slice(state.self_k[i], 2, start, k_new)
            v_new = _split_heads(be, be.slice(part, 2, 2 * d, 3 * d), heads_count)
            be.write_slice(state.self_v[i], 2, start, v_new)
            k = be.slice(state.self_k[i], 2, 0, start + steps)
            v = be.slice(state.self_v[i], 2, 0, start + steps)
            ctxs.append(_merge_heads(be, be.attention(q, k, v, masks[m])))
        x = be.add(x, _linear(be, _join(be, ctxs + padding, 0), a.w_out, a.b_out))

        c = layer.cross_attn
        h = be.layer_norm(x, c.norm_g, c.norm_b)
        queries = _linear(be, h, c.w_q, c.b_q)
        ctxs = []
        wanted = [head for layer_index, head in heads if layer_index == i]
        for m, state in enumerate(states):
            q = _split_heads(be, _rows(be, queries, spans, m), heads_count)
            if steps == 1 and _fused_cross_attention(be, [state], i):  # as a step does
                ctx, scores = _query_attention_rows(q, state.cross_kt[i], state.cross_v[i], scale)
                if wanted:
                    for head in wanted:
                        collected[m][(i, head)] = scores[:, head].copy()
                ctxs.append(ctx)
                continue
            scores = be.scale(be.matmul(q, state.cross_kt[i]), scale)
            if wanted:
                host = be.to_host(scores)
                for head in wanted:
                    collected[m][(i, head)] = np.array(host[:, head], dtype=np.float32)
            ctxs.append(_merge_heads(be, be.matmul(be.softmax(scores), state.cross_v[i])))
        x = be.add(x, _linear(be, _join(be, ctxs + padding, 0), c.w_out, c.b_out))

        x = be.add(x, _ffn(be, layer.ffn, x))
    attention = []
    for m, state in enumerate(states):
        state.length = starts[m] + steps
        frames = state.cross_v[0].shape[2] if state.cross_v else 0
        rows_m = spans[m][1] - spans[m][0]
        attention.append(
            np.stack([collected[m][pair] for pair in heads], axis=1)
            if heads
            else np.zeros((rows_m, 0, steps, frames), np.float32)
        )
    return be.layer_norm(x, w.dec_norm_g, w.dec_norm_b), attention


def _step_products(be: ArrayBackend) -> AbstractContextManager[None]:
    """Where a decoding step's BLAS products run: on the numpy backend on one BLAS thread
    (:func:`backends.parallel.one_thread`). Its weight products are packed ones
    (:mod:`backends.panels`, split over the caller's cores where large enough); what is
    left for the BLAS is each member's self-attention over its cache, products of
    microseconds, and each waits for every BLAS thread, which with another job on the
    second core takes milliseconds (a [1, 384] x [384, 1536] product took 55 us on one
    thread, 930 us on two at load 2.4). Other backends: nothing changes."""
    if isinstance(be, NumpyBackend):
        return parallel.one_thread()
    return contextlib.nullcontext()


def _step(
    be: ArrayBackend,
    w: WhisperWeights,
    states: Sequence[DecoderState],
    tokens: Sequence[int],
    pad: int,
    lanes: int,
) -> Array:
    """:func:`_decode` for one token per member (a decoding step): hidden states [rows, d].

    The same products as the general path, with fewer operations around them: rows
    are 2-D ``[rows, d]`` throughout, and with one position per member a head split
    or merge is a reshape (no transposed copies), the causal mask is not needed and
    the per-member bookkeeping (spans, tiled positions) is gone. Every value equals
    the general path's bit for bit on numpy (``tests/models/test_whisper_model.py``).
    """
    starts = [state.length for state in states]
    if any(start + 1 > MAX_TARGET_POSITIONS for start in starts):
        raise ValueError("decoder input exceeds 448 positions")
    d, heads = w.d_model, w.dec_heads
    head_dim = d // heads
    scale = 1.0 / math.sqrt(head_dim)
    members = len(states)
    x = _token_rows(be, w, np.asarray(tokens, dtype=np.intp))
    x = be.add(x, be.take(w.dec_pos, np.asarray(starts, dtype=np.intp), axis=0))
    padding = [be.zeros((-members % pad, d))] if members % pad else []
    x = _join(be, [x, *padding], 0)
    one = members == 1 and not padding

    def head_rows(rows: Array, m: int, lo: int) -> Array:
        """Member ``m``'s columns ``lo:lo + d`` of ``rows`` as [1, heads, 1, head_dim]."""
        row = rows if one else be.slice(rows, 0, m, m + 1)
        return be.reshape(be.slice(row, 1, lo, lo + d), (1, heads, 1, head_dim))

    for i, layer in enumerate(w.dec_layers):
        a = layer.self_attn
        qkv = _project(be, be.layer_norm(x, a.norm_g, a.norm_b), a.w_in, a.b_in, lanes)
        ctxs = []
        for m, state in enumerate(states):
            start = starts[m]
            be.write_slice(state.self_k[i], 2, start, head_rows(qkv, m, d))
            be.write_slice(state.self_v[i], 2, start, head_rows(qkv, m, 2 * d))
            k = be.slice(state.self_k[i], 2, 0, start + 1)
            v = be.slice(state.self_v[i], 2, 0, start + 1)
            ctxs.append(be.reshape(be.attention(head_rows(qkv, m, 0), k, v), (1, d)))
        x = be.add(x, _project(be, _join(be, ctxs + padding, 0), a.w_out, a.b_out, lanes))

        c = layer.cross_attn
        queries = _project(be, be.layer_norm(x, c.norm_g, c.norm_b), c.w_q, c.b_q, lanes)
        if _fused_cross_attention(be, states, i):
            context = _step_cross_attention(queries, states, i, scale, x.shape[0], lanes)
        else:
            ctxs = []
            for m, state in enumerate(states):
                scores = be.scale(be.matmul(head_rows(queries, m, 0), state.cross_kt[i]), scale)
                ctx = be.matmul(be.softmax(scores), state.cross_v[i])
                ctxs.append(be.reshape(ctx, (1, d)))
            context = _join(be, ctxs + padding, 0)
        x = be.add(x, _project(be, context, c.w_out, c.b_out, lanes))

        x = be.add(x, _ffn(be, layer.ffn, x, lanes))
    for m, state in enumerate(states):
        state.length = starts[m] + 1
    return be.layer_norm(x, w.dec_norm_g, w.dec_norm_b)


def _fused_cross_attention(be: ArrayBackend, states: Sequence[DecoderState], layer: int) -> bool:
    """Whether one-token cross-attention at ``layer`` runs as :func:`_step_cross_attention`:
    on numpy, over windows held as C-contiguous float32 (what :meth:`DecoderState.set_memory`
    makes of an encoder's output; anything else takes the backend's products)."""
    return isinstance(be, NumpyBackend) and all(
        a.dtype == np.float32 and a.flags.c_contiguous
        for state in states
        for a in (state.cross_kt[layer], state.cross_v[layer])
    )


def _step_cross_attention(
    queries: np.ndarray,
    states: Sequence[DecoderState],
    layer: int,
    scale: float,
    rows: int,
    lanes: int,
) -> np.ndarray:
    """A decoding step's cross-attention on numpy: member ``m``'s query row ``queries[m]``
    over its own window (:func:`_query_attention_rows`), on ``lanes`` cores (each member
    reads only its own 4.6 MB of keys and values a layer: memory-bound, and two cores read
    faster than one): each (member, head) a piece for the spinning helpers
    (:mod:`backends.handoff`), else the members as pieces of a split; context rows [rows,
    d], zero after the members (padding rows)."""
    heads = states[0].cross_kt[layer].shape[1]
    out = np.zeros((rows, queries.shape[1]), np.float32)
    members = len(states)
    if handoff.usable(lanes) and _same_windows(states, layer, heads):
        keys = [state.cross_kt[layer][0] for state in states]
        values = [state.cross_v[layer][0] for state in states]
        q = np.ascontiguousarray(queries[:members], dtype=np.float32)
        if handoff.HELPERS.attention(q, keys, values, scale, out[:members], lanes):
            return out

    def member(m: int) -> None:
        state = states[m]
        query = queries[m].reshape(1, heads, 1, -1)
        ctx, _ = _query_attention_rows(query, state.cross_kt[layer], state.cross_v[layer], scale)
        out[m] = ctx[0, 0]

    parallel.run_pieces(member, range(len(states)), lanes)
    return out


def _same_windows(states: Sequence[DecoderState], layer: int, heads: int) -> bool:
    """Whether every member holds one non-empty window of the same shape at ``layer`` and
    the (member, head) pieces fit one job (what the helpers' attention takes)."""
    kt, v = states[0].cross_kt[layer].shape, states[0].cross_v[layer].shape
    return (
        kt[0] == 1
        and kt[3] > 0
        and len(states) * heads <= handoff.MAX_PIECES
        and all(s.cross_kt[layer].shape == kt and s.cross_v[layer].shape == v for s in states)
    )


def _query_attention_rows(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """One-token cross-attention on numpy, the one place it is computed (a step's members,
    the general path's one-token inputs): one query row a head for each of a member's rows
    (q [B, H, 1, D] over keys [B, H, D, T] and values [B, H, T, D], or one window [1, ...]
    for every row) through :func:`backends.kernels.query_attention`; returns the context
    [B, 1, H*D] and the scaled scores before the softmax [B, H, 1, T]."""
    batch, heads, _, dim = q.shape
    ctx = np.empty((batch, 1, heads * dim), np.float32)
    scores = np.empty((batch, heads, 1, keys.shape[3]), np.float32)
    for b in range(batch):
        window = b if keys.shape[0] > 1 else 0  # one window may serve every row
        kernels.query_attention(
            np.ascontiguousarray(q[b, :, 0, :], dtype=np.float32),
            keys[window],
            values[window],
            np.float32(scale),
            scores[b, :, 0, :],
            ctx[b, 0].reshape(heads, dim),
        )
    return ctx, scores


def logits(be: ArrayBackend, w: WhisperWeights, hidden: Array) -> Array:
    """Vocabulary logits of hidden states [..., d] (projection tied to the embedding)."""
    *lead, d = hidden.shape
    rows = be.reshape(hidden, (-1, d))
    if isinstance(w.embedding, PackedWeight):
        out = panels.linear(rows, w.embedding)
    else:
        out = be.matmul(rows, w.embedding)
    return be.reshape(out, (*lead, w.vocab_size))
