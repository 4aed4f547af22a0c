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
