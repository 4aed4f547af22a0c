"""VITS text encoder: phoneme embedding, six relative-position attention blocks, stats.

A request is one unpadded sentence (batch 1), so the sequence mask is all ones
and the masked fills of the PyTorch code are identities; they are left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import numpy as np

from backends.base import Array, ArrayBackend
from backends.numpy_backend import _exp_rows
from backends.piper import column_norm, host
from backends.piper.layers import Weights, channel_norm, conv, split_channels
from backends.piper.loader import Hyper


def encode(be: ArrayBackend, w: Weights, h: Hyper, ids: np.ndarray) -> tuple[Array, Array, Array]:
    """Phoneme ids [T] -> (hidden x, prior mean m, prior log-std logs), each [1, C, T]."""
    t = int(ids.shape[0])
    x = be.scale(be.take(w["enc_p.emb.weight"], ids, 0), math.sqrt(h.hidden))  # [T, H]
    x = be.reshape(be.transpose(x, (1, 0)), (1, h.hidden, t))
    for i in range(h.n_layers):
        y = _relative_attention(be, w, h, f"enc_p.encoder.attn_layers.{i}", x)
        x = channel_norm(be, w, f"enc_p.encoder.norm_layers_1.{i}", be.add(x, y))
        f = f"enc_p.encoder.ffn_layers.{i}"
        pad = (h.kernel - 1) // 2
        y = be.relu(conv(be, w, f"{f}.conv_1", x, padding=pad))
        y = conv(be, w, f"{f}.conv_2", y, padding=pad)
        x = channel_norm(be, w, f"enc_p.encoder.norm_layers_2.{i}", be.add(x, y))
    stats = conv(be, w, "enc_p.proj", x)
    m, logs = split_channels(be, stats, h.inter)
    return x, m, logs


def _heads(be: ArrayBackend, x: Array, n_heads: int) -> Array:
    """[1, C, T] -> [1, heads, T, C / heads]."""
    _, c, t = x.shape
    return be.transpose(be.reshape(x, (1, n_heads, c // n_heads, t)), (0, 1, 3, 2))


def _relative_embeddings(be: ArrayBackend, emb: Array, window: int, t: int) -> Array:
    """The [1, 2T-1, dk] slice of the learned window embeddings (zero beyond the window)."""
    pad = max(t - (window + 1), 0)
    start = max((window + 1) - t, 0)
    if pad:
        emb = be.pad(emb, 1, pad, pad)
    return be.slice(emb, 1, start, start + 2 * t - 1)


def _relative_attention(be: ArrayBackend, w: Weights, h: Hyper, p: str, x: Array) -> Array:
    t = x.shape[2]
    dk = h.hidden // h.n_heads
    q = be.scale(_heads(be, conv(be, w, f"{p}.conv_q", x), h.n_heads), 1.0 / math.sqrt(dk))
    k = _heads(be, conv(be, w, f"{p}.conv_k", x), h.n_heads)
    v = _heads(be, conv(be, w, f"{p}.conv_v", x), h.n_heads)
    scores = be.matmul(q, be.transpose(k, (0, 1, 3, 2)))  # [1, h, T, T]
    rel_k = _relative_embeddings(be, w[f"{p}.emb_rel_k"], h.window, t)  # [1, 2T-1, dk]
    rel_logits = be.matmul(q, be.transpose(be.reshape(rel_k, (1, 1, 2 * t - 1, dk)), (0, 1, 3, 2)))
    scores = be.add(scores, _relative_to_absolute(be, rel_logits))
    p_attn = be.softmax(scores, -1)
    out = be.matmul(p_attn, v)
    rel_v = be.reshape(
        _relative_embeddings(be, w[f"{p}.emb_rel_v"], h.window, t), (1, 1, 2 * t - 1, dk)
    )
    out = be.add(out, be.matmul(_absolute_to_relative(be, p_attn), rel_v))
    out = be.reshape(be.transpose(out, (0, 1, 3, 2)), (1, h.hidden, t))
    return conv(be, w, f"{p}.conv_o", out)


def _relative_to_absolute(be: ArrayBackend, x: Array) -> Array:
    """[b, h, T, 2T-1] relative logits -> [b, h, T, T] (the pad-and-reshape skew)."""
    b, nh, t, _ = x.shape
    x = be.reshape(be.pad(x, 3, 0, 1), (b, nh, 2 * t * t))
    x = be.reshape(be.pad(x, 2, 0, t - 1), (b, nh, t + 1, 2 * t - 1))
    return be.slice(be.slice(x, 2, 0, t), 3, t - 1, 2 * t - 1)


def _absolute_to_relative(be: ArrayBackend, x: Array) -> Array:
    """[b, h, T, T] attention weights -> [b, h, T, 2T-1] by relative offset."""
    b, nh, t, _ = x.shape
    x = be.reshape(be.pad(x, 3, 0, t - 1), (b, nh, t * (2 * t - 1)))
    x = be.reshape(be.pad(x, 2, t, 0), (b, nh, t, 2 * t))
    return be.slice(x, 3, 1, 2 * t)


# ---- the numpy backend's path ------------------------------------------------------------


def prepare_encoder(w: Weights, h: Hyper) -> dict[str, host.ConvWeights]:
    """The encoder's convs as fused-conv operands (host arrays), by module name: per layer
    Q, K and V as one conv ``{layer}.conv_qkv`` (Q's rows, bias included, scaled by
    ``1/sqrt(dk)`` once here rather than on every request), ``conv_o``, the FFN's two
    convs, and the stats projection ``enc_p.proj``: about 25 MB of copies (the FFN's
    per-tap matrices; ``conv_o`` and the projection are views of the weights). The
    FFN's convs keep their per-tap GEMMs: Winograd's filters for them would take 42 MB
    (two thirds of the model's weights) for products over a sentence's phonemes, where
    they measured 0.88-1.15 of the per-tap time (40 to 160 phonemes, one thread)."""
    out: dict[str, host.ConvWeights] = {}
    scale = 1.0 / math.sqrt(h.hidden // h.n_heads)
    for i in range(h.n_layers):
        p = f"enc_p.encoder.attn_layers.{i}"
        ws = [np.asarray(w[f"{p}.conv_{n}.weight"], np.float64) for n in "qkv"]
        bs = [np.asarray(w[f"{p}.conv_{n}.bias"], np.float64) for n in "qkv"]
        ws[0], bs[0] = ws[0] * scale, bs[0] * scale
        out[f"{p}.conv_qkv"] = host.prepare(
            np.concatenate(ws).astype(np.float32),
            np.concatenate(bs).astype(np.float32),
            row_pieces=True,
        )
        names = [f"{p}.conv_o"] + [f"enc_p.encoder.ffn_layers.{i}.conv_{n}" for n in (1, 2)]
        for name in names:
            weight, bias = w[f"{name}.weight"], w.get(f"{name}.bias")
            out[name] = host.prepare(weight, bias, fewer_products=False, row_pieces=True)
    proj = w["enc_p.proj.weight"], w.get("enc_p.proj.bias")
    out["enc_p.proj"] = host.prepare(*proj, fewer_products=False, row_pieces=True)
    return out


def encode_host(
    prep: Mapping[str, host.ConvWeights], w: Weights, h: Hyper, ids: np.ndarray, lanes: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`encode` on host arrays with fused convs: ids [T] -> (x, m, logs), each [1, C, T].

    Every conv is :func:`host.conv_same` (per-tap GEMMs or Winograd's products, bias,
    residual and ReLU fused); Q, K and V are one product; each head's
    relative-position terms are computed only on the ``2 window + 1`` diagonals they
    reach (:func:`_attend`) instead of as skewed ``[T, 2T - 1]`` matrices. The caller
    says where it runs (:class:`backends.piper.model.PiperModel` keeps it on one core and
    one BLAS thread) and on how many cores its convs' GEMMs may run, ``lanes`` (each
    conv's output rows in two fixed pieces, :func:`host.add_conv`: the same bits on one
    core or more). Values equal :func:`encode`'s up to float32 summation order and Q's
    scaling folded into its weights.
    """
    t, c = int(ids.shape[0]), h.hidden
    emb = np.asarray(w["enc_p.emb.weight"], np.float32)
    x = np.ascontiguousarray(emb[ids].T) * np.float32(math.sqrt(c))  # [H, T]
    qkv = np.empty((3 * c, t), np.float32)
    heads = np.empty((c, t), np.float32)
    inner = np.empty((h.filter, t), np.float32)
    sums = np.empty((column_norm.SUMS, t), np.float32)  # every norm's scratch
    for i in range(h.n_layers):
        p = f"enc_p.encoder.attn_layers.{i}"
        host.conv_same(x, prep[f"{p}.conv_qkv"], qkv, lanes=lanes)
        rel_k = np.asarray(w[f"{p}.emb_rel_k"], np.float32)[0]
        rel_v = np.asarray(w[f"{p}.emb_rel_v"], np.float32)[0]
        for head in range(h.n_heads):
            _attend(qkv, head, h.n_heads, rel_k, rel_v, heads)
        norm = f"enc_p.encoder.norm_layers_1.{i}"
        x = _add_and_norm(prep[f"{p}.conv_o"], heads, x, w, norm, lanes, sums)
        f = f"enc_p.encoder.ffn_layers.{i}"
        host.conv_same(x, prep[f"{f}.conv_1"], inner, post_slope=0.0, lanes=lanes)  # ReLU
        norm = f"enc_p.encoder.norm_layers_2.{i}"
        x = _add_and_norm(prep[f"{f}.conv_2"], inner, x, w, norm, lanes, sums)
    stats = np.empty((2 * h.inter, t), np.float32)
    host.conv_same(x, prep["enc_p.proj"], stats, lanes=lanes)
    return x[None], stats[None, : h.inter], stats[None, h.inter :]


def _add_and_norm(
    cw: host.ConvWeights,
    src: np.ndarray,
    x: np.ndarray,
    w: Weights,
    norm: str,
    lanes: int,
    sums: np.ndarray,
) -> np.ndarray:
    """``channel_norm(x + conv(src))`` as a new C-contiguous [C, T] array (the conv's GEMMs on
    up to ``lanes`` cores; the norm over columns, :func:`column_norm.channel_norm`: the numpy
    backend's row kernel's bits without its transposed copies; ``sums`` its scratch)."""
    y = x.copy()
    host.conv_same(src, cw, y, add_to=True, lanes=lanes)
    out = np.empty_like(y)
    gamma, beta = (np.asarray(w[f"{norm}.{n}"], np.float32) for n in ("gamma", "beta"))
    column_norm.channel_norm(y, gamma, beta, np.float32(1e-5), out, sums)
    return out


def _attend(
    qkv: np.ndarray, head: int, n_heads: int, rel_k: np.ndarray, rel_v: np.ndarray, out: np.ndarray
) -> None:
    """One head's relative-position attention: ``out``'s rows of ``head`` [dk, T] from
    ``qkv`` [3C, T] (Q already scaled). With ``window = (rel_k.shape[0] - 1) / 2``, query
    ``i`` and key ``j`` get ``q_i . rel_k[window + j - i]`` added to their score and the
    weight ``p_ij`` of ``rel_v[window + j - i]`` added to the output where
    ``|j - i| <= window`` (beyond it the learned embeddings are zero padding)."""
    c = qkv.shape[0] // 3
    dk = c // n_heads
    rows = slice(head * dk, (head + 1) * dk)
    q, k, v = qkv[rows], qkv[c:][rows], qkv[2 * c :][rows]
    t = q.shape[1]
    window = (rel_k.shape[0] - 1) // 2
    scores = np.matmul(q.T, k)  # [T, T]
    near = np.matmul(q.T, rel_k.T)  # [T, 2 window + 1]: q_i . rel_k[r]
    for d, diagonal, at in _diagonals(scores, window):
        diagonal += near[at, window + d]
    scores /= _exp_rows(scores)  # the backend's softmax, in place
    o = out[rows]
    np.matmul(v, scores.T, out=o)
    band = np.zeros((t, 2 * window + 1), np.float32)  # band[i, window + d] = p[i, i + d]
    for d, diagonal, at in _diagonals(scores, window):
        band[at, window + d] = diagonal
    o += np.matmul(rel_v.T, band.T)


def _diagonals(m: np.ndarray, window: int) -> Iterator[tuple[int, np.ndarray, slice]]:
    """For each offset ``d`` in ``[-window, window]`` that a square C-contiguous ``m`` [T, T]
    has: ``(d, view of m[i, i + d], the rows i it covers)``."""
    t = m.shape[0]
    flat = m.reshape(-1)
    for d in range(-window, window + 1):
        count = t - abs(d)
        if count <= 0:
            continue
        first = d if d >= 0 else -d * t
        rows = slice(0, count) if d >= 0 else slice(-d, t)
        yield d, flat[first : first + (count - 1) * (t + 1) + 1 : t + 1], rows
