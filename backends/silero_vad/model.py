"""Silero VAD v5/v6 (16 kHz) forward pass on an array backend.

Graph, read from the 16 kHz branch of ``silero_vad.onnx``: each step sees a
576-sample window (64 samples of context, the tail of the previous chunk, then
the 512-sample chunk), reflect-padded by 64 on the right to 640 samples.

1. STFT as a conv: 258 filters of 256 taps, stride 128 -> 4 frames; the first
   129 rows are the real parts, the next 129 the imaginary parts; magnitude
   ``sqrt(re^2 + im^2)`` -> [129, 4]. Here the reflect padding is folded into
   the last frame's filters at load time (it is linear), so no padding is built.
2. Encoder: 4 conv1d (k=3, pad=1) + ReLU: 129->128 (s1), 128->64 (s2),
   64->64 (s2), 64->128 (s1) -> [128, 1].
3. Decoder: one LSTM cell step (hidden 128; state (h, c) carried from chunk to
   chunk), ReLU, 1x1 conv 128->1, sigmoid, mean over the single time step.

The encoder has no state, so it runs on every chunk at once (chunks along the
batch axis); only the LSTM walks through time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from backends.base import Array, ArrayBackend
from backends.shapes import conv1d_length
from backends.silero_vad.weights import SileroWeights

SAMPLE_RATE: Final = 16000
CHUNK: Final = 512
CONTEXT: Final = 64
WINDOW: Final = CHUNK + CONTEXT
HIDDEN: Final = 128
ENCODE_BLOCK: Final = 256  # windows per encoder pass
STREAM_BLOCK: Final = 8  # chunks encoded together while streaming, and per batched step (256 ms)
_HOP: Final = 128
_TAPS: Final = 256
_FRAMES: Final = 4
_BINS: Final = 129
_STRIDES: Final = (1, 2, 2, 1)


def encode(be: ArrayBackend, w: SileroWeights, windows: Array) -> Array:
    """Windows [N, 576] -> LSTM inputs [N, 128] (no state involved).

    Channels-last: every product is one [rows, k] @ [k, out] matmul per window, or
    per row for windows of under 4 rows (:func:`_product`; numpy's matmul loops
    over the window and row axes), so on the numpy backend a window's features
    never depend on how many windows run together: batched, offline and streamed
    runs agree bit for bit.
    """
    n = windows.shape[0]
    hops = be.reshape(be.slice(windows, 1, 0, _FRAMES * _HOP), (n, _FRAMES, _HOP))
    # frame t (t < 3) = hops t and t + 1; the last frame reads the 192-sample tail
    heads = be.concat([be.slice(hops, 1, 0, _FRAMES - 1), be.slice(hops, 1, 1, _FRAMES)], 2)
    tail = be.reshape(be.slice(windows, 1, (_FRAMES - 1) * _HOP, WINDOW), (n, 1, -1))
    spec = be.concat([_product(be, heads, w.stft), _product(be, tail, w.stft_tail)], 1)
    power = be.mul(spec, spec)
    x = be.sqrt(be.add(be.slice(power, 2, 0, _BINS), be.slice(power, 2, _BINS, 2 * _BINS)))
    for (cw, cb), stride in zip(w.convs, _STRIDES, strict=True):
        x = _conv3(be, x, cw, cb, stride)
    return be.reshape(x, (n, HIDDEN))


def _conv3(be: ArrayBackend, x: Array, w: Array, b: Array, stride: int) -> Array:
    """Conv1d (kernel 3, padding 1) + ReLU on channels-last [N, T, C] via explicit im2col."""
    n, t_in, c = x.shape
    t_out = conv1d_length(t_in, 3, stride, padding=1)
    if t_out == 1:  # taps 1.. read input rows 0..; tap 0 reads only padding: skip the zeros
        rows = min(t_in, 2)
        cols = be.reshape(x if rows == t_in else be.slice(x, 1, 0, rows), (n, 1, rows * c))
        return be.relu(be.add(_product(be, cols, be.slice(w, 0, c, c + rows * c)), b))
    zero = be.zeros((n, 1, c))
    xp = be.concat([zero, x, zero], 1)
    if stride == 1:  # column k*C + c of output t is xp[t + k, c]
        cols = be.concat([be.slice(xp, 1, k, k + t_out) for k in range(3)], 2)
    else:  # one output row per step: the 3 input rows it reads, flattened
        cols = be.concat(
            [
                be.reshape(be.slice(xp, 1, stride * t, stride * t + 3), (n, 1, 3 * c))
                for t in range(t_out)
            ],
            1,
        )
    return be.relu(be.add(_product(be, cols, w), b))


ROW_PRODUCTS: Final = 4
"""Windows with fewer rows than this multiply row by row (one [1, k] @ [k, out] each)."""


def _product(be: ArrayBackend, x: Array, w: Array) -> Array:
    """``x`` [N, T, k] @ ``w`` [k, out] per window: each window's rows never meet another's.

    Windows of fewer than :data:`ROW_PRODUCTS` rows multiply row by row (numpy's
    matmul loops over [N, T] and calls a matrix-vector product per row); OpenBLAS's
    small-M matrix product packs all of ``w`` on every call, so one window's 3 STFT
    frames took 33 us as one product and 14 us as three rows (conv2's 2 rows: 7.3
    and 4.1 us; 256 windows: 7.9 and 3.0 ms). Longer windows stay one product each.
    Either way a window's result does not depend on ``N``.
    """
    n, t, k = x.shape
    if t == 1 or t >= ROW_PRODUCTS:  # one row per window is already a row product
        return be.matmul(x, w)
    return be.reshape(be.matmul(be.reshape(x, (n, t, 1, k)), w), (n, t, w.shape[-1]))


def decode(be: ArrayBackend, w: SileroWeights, hs: Array) -> Array:
    """LSTM outputs [..., 128] -> speech probabilities [...] (ReLU, 1x1 conv, sigmoid)."""
    logits = be.add(be.sum(be.mul(be.relu(hs), w.out_w), axis=-1), w.out_b)
    return be.sigmoid(logits)


def encode_all(be: ArrayBackend, w: SileroWeights, windows: Array) -> Array:
    """Windows [N, 576] -> features [N, 128], in blocks that keep im2col buffers in cache."""
    n = windows.shape[0]
    if n <= ENCODE_BLOCK:
        return encode(be, w, windows)
    blocks = [
        encode(be, w, be.slice(windows, 0, i, min(i + ENCODE_BLOCK, n)))
        for i in range(0, n, ENCODE_BLOCK)
    ]
    return blocks[0] if len(blocks) == 1 else be.concat(blocks, 0)


def recur(
    be: ArrayBackend, w: SileroWeights, feats: Array, h: Array, c: Array
) -> tuple[Array, Array, Array]:
    """Features [T, B, 128] and state (h, c) [B, 128] -> (probs [T, B], h, c)."""
    hs, h, c = be.lstm_sequence(feats, h, c, w.w_ih, w.w_hh, w.lstm_bias)
    return decode(be, w, hs), h, c


def forward(
    be: ArrayBackend, w: SileroWeights, windows: Array, h: Array, c: Array
) -> tuple[Array, Array, Array]:
    """Windows [T, B, 576] (time-major) and state (h, c) [B, 128] -> (probs [T, B], h, c)."""
    steps, batch = windows.shape[0], windows.shape[1]
    feats = encode_all(be, w, be.reshape(windows, (steps * batch, WINDOW)))
    return recur(be, w, be.reshape(feats, (steps, batch, HIDDEN)), h, c)


def time_major(frames: Sequence[np.ndarray], steps: int) -> np.ndarray:
    """Members' windows ``[n_i, 576]`` -> ``[steps, len(frames), 576]``, zero-padded at the end.

    A member's padded steps come after its last real chunk, so (the LSTM walking
    forward in time) they never influence its kept probabilities.
    """
    windows = np.zeros((steps, len(frames), WINDOW), np.float32)
    for j, f in enumerate(frames):
        windows[: len(f), j] = f
    return windows


def stream_frames(data: np.ndarray, final: bool, context: np.ndarray) -> np.ndarray:
    """The windows a stream processes from ``data`` (its pending samples, then new audio).

    Every whole chunk, plus (``final`` only) the zero-padded partial chunk at the end;
    a partial chunk of a non-final piece stays pending.
    """
    n = len(data) // CHUNK + (1 if final and len(data) % CHUNK else 0)
    return frame(data[: n * CHUNK], context)


def frame(audio: np.ndarray, context: np.ndarray | None = None) -> np.ndarray:
    """Host framing: audio -> windows [ceil(len/512), 576] as silero's OnnxWrapper builds them.

    The last chunk is zero-padded to 512 samples; ``context`` (64 samples, zeros
    by default) precedes the first chunk, and every later window starts with the
    last 64 samples of the previous chunk.
    """
    n = -(-len(audio) // CHUNK)
    if n == 0:
        return np.zeros((0, WINDOW), np.float32)
    if n == 1 and len(audio) == CHUNK:  # live streaming: one full chunk
        head = np.zeros(CONTEXT, np.float32) if context is None else context
        return np.concatenate([head, audio])[None, :].astype(np.float32, copy=False)
    padded = np.zeros(CONTEXT + n * CHUNK, dtype=np.float32)
    if context is not None:
        padded[:CONTEXT] = context
    padded[CONTEXT : CONTEXT + len(audio)] = audio
    heads = padded[: n * CHUNK].reshape(n, CHUNK)[:, :CONTEXT]  # 64 samples before each chunk
    return np.concatenate([heads, padded[CONTEXT:].reshape(n, CHUNK)], axis=1)


# ---- host fast path: the batched engine's forward as a few large GEMMs ------------------

HOST_BLOCK: Final = 128
"""Windows per block of :func:`host_encode` (its im2col buffers stay in the L2 cache)."""

_GATE_SCALE: Final = np.concatenate(
    [np.full(2 * HIDDEN, 0.5), np.ones(HIDDEN), np.full(HIDDEN, 0.5)]
).astype(np.float32)
"""Pre-scale of the LSTM gates for the tanh form of sigmoid: 0.5 for i, f, o and 1 for g."""


def on_host(w: SileroWeights) -> bool:
    """Whether ``w`` lives in host numpy arrays (the :func:`host_encode` path applies)."""
    return all(isinstance(a, np.ndarray) for a in w.arrays())


def host_encode(w: SileroWeights, windows: np.ndarray) -> np.ndarray:
    """Windows [N, 576] -> LSTM inputs [N, 128], as :func:`encode` computes them.

    Every layer is one GEMM over all the windows of a block (their rows stacked),
    where :func:`encode` multiplies window by window (and row by row): a batched
    engine's hundreds of windows cost a few BLAS calls instead of thousands. The
    results agree with :func:`encode` to float32 rounding (a GEMM sums in another
    order than a matrix-vector product), not bit for bit, so sessions keep
    :func:`encode`, whose results never depend on the batch.
    """
    n = len(windows)
    x = np.ascontiguousarray(windows, dtype=np.float32)
    if n <= HOST_BLOCK:
        return _host_encode_block(w, x)
    out = np.empty((n, HIDDEN), np.float32)
    for lo in range(0, n, HOST_BLOCK):
        out[lo : lo + HOST_BLOCK] = _host_encode_block(w, x[lo : lo + HOST_BLOCK])
    return out


def _host_encode_block(w: SileroWeights, x: np.ndarray) -> np.ndarray:
    """:func:`host_encode` of one block of contiguous windows [n, 576]."""
    n = len(x)
    item = x.itemsize
    stft, stft_tail = np.asarray(w.stft), np.asarray(w.stft_tail)
    # STFT: frames 0-2 read 256 samples from 128 * t, frame 3 the 192-sample tail
    heads = np.lib.stride_tricks.as_strided(
        x, (n, _FRAMES - 1, _TAPS), (WINDOW * item, _HOP * item, item), writeable=False
    )
    spec = np.matmul(heads.reshape(n * (_FRAMES - 1), _TAPS), stft).reshape(n, _FRAMES - 1, -1)
    tail = np.matmul(x[:, (_FRAMES - 1) * _HOP :], stft_tail)
    # magnitudes into the time-padded input of conv1: [n, 1 + 4 + 1, 129]
    xp = np.zeros((n, _FRAMES + 2, _BINS), np.float32)
    np.square(spec, out=spec)
    np.add(spec[:, :, :_BINS], spec[:, :, _BINS:], out=xp[:, 1:_FRAMES])
    np.square(tail, out=tail)
    np.add(tail[:, :_BINS], tail[:, _BINS:], out=xp[:, _FRAMES])
    np.sqrt(xp, out=xp)
    (w1, b1), (w2, b2), (w3, b3), (w4, b4) = ((np.asarray(a), np.asarray(b)) for a, b in w.convs)
    # conv1 (k3, s1, 129 -> 128, 4 -> 4 frames): output t reads padded rows t..t+2
    cols = np.lib.stride_tricks.as_strided(
        xp, (n, _FRAMES, 3 * _BINS), ((_FRAMES + 2) * _BINS * 4, _BINS * 4, 4), writeable=False
    ).reshape(n * _FRAMES, 3 * _BINS)
    c1 = w1.shape[1]
    y1 = np.zeros((n, _FRAMES + 2, c1), np.float32)  # conv2's time-padded input
    np.add(np.matmul(cols, w1).reshape(n, _FRAMES, c1), b1, out=y1[:, 1 : _FRAMES + 1])
    np.maximum(y1, 0, out=y1)
    # conv2 (k3, s2, 128 -> 64, 4 -> 2 frames): output t reads padded rows 2t..2t+2
    cols = np.lib.stride_tricks.as_strided(
        y1, (n, 2, 3 * c1), ((_FRAMES + 2) * c1 * 4, 2 * c1 * 4, 4), writeable=False
    ).reshape(n * 2, 3 * c1)
    y2 = np.matmul(cols, w2)
    y2 += b2
    np.maximum(y2, 0, out=y2)
    # conv3 (s2, 2 -> 1 frame) and conv4 (s1, 1 -> 1): tap 0 reads only padding
    c2 = w2.shape[1]
    y3 = np.matmul(y2.reshape(n, 2 * c2), w3[c2 : 3 * c2])
    y3 += b3
    np.maximum(y3, 0, out=y3)
    c3 = w3.shape[1]
    y4: np.ndarray = np.matmul(y3, w4[c3 : 2 * c3])
    y4 += b4
    np.maximum(y4, 0, out=y4)
    return y4


def host_recur(
    w: SileroWeights,
    feats: np.ndarray,
    h: np.ndarray,
    c: np.ndarray,
    lengths: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features [T, B, 128] and state (h, c) [B, 128] -> (probs [T, B], h, c), as :func:`recur`.

    One GEMM per time step for all rows. ``lengths`` [B]: row ``j`` has only
    ``lengths[j]`` real steps; its state stops there (the steps after it are
    padding, their probabilities meaningless), so rows of any length share one walk.
    """
    steps, batch, _ = feats.shape
    w_ih, w_hh = np.asarray(w.w_ih), np.asarray(w.w_hh)
    gx = np.matmul(feats.reshape(steps * batch, HIDDEN), w_ih.T).reshape(steps, batch, -1)
    gx += np.asarray(w.lstm_bias)
    hs = np.empty((steps, batch, HIDDEN), np.float32)
    h = np.asarray(h, np.float32)
    c = np.asarray(c, np.float32)
    for t in range(steps):
        z = np.matmul(h, w_hh.T)
        z += gx[t]
        z *= _GATE_SCALE
        np.tanh(z, out=z)
        gates = z[:, : 2 * HIDDEN]
        gates *= np.float32(0.5)
        gates += np.float32(0.5)
        out_gate = z[:, 3 * HIDDEN :]
        out_gate *= np.float32(0.5)
        out_gate += np.float32(0.5)
        c_new = z[:, HIDDEN : 2 * HIDDEN] * c
        c_new += z[:, :HIDDEN] * z[:, 2 * HIDDEN : 3 * HIDDEN]
        h_new = hs[t]
        np.tanh(c_new, out=h_new)
        h_new *= out_gate
        if lengths is not None and t:
            keep = (lengths <= t)[:, None]
            h_new = np.where(keep, h, h_new)
            c_new = np.where(keep, c, c_new)
        h, c = h_new, c_new
    h_out, c_out = np.array(h, np.float32), np.array(c, np.float32)  # before the ReLU below
    np.maximum(hs, 0, out=hs)
    logits = np.matmul(hs, np.asarray(w.out_w))
    logits += np.asarray(w.out_b)
    logits *= np.float32(0.5)
    np.tanh(logits, out=logits)
    logits *= np.float32(0.5)
    logits += np.float32(0.5)
    return logits, h_out, c_out
