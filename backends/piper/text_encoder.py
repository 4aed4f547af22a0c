"""VITS text encoder: phoneme embedding, six relative-position attention blocks, stats.

A request is one unpadded sentence (batch 1), so the sequence mask is all ones
and the masked fills of the PyTorch code are identities; they are left out.
"""

from __future__ import annotations

import math

import numpy as np

from backends.base import Array, ArrayBackend
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
