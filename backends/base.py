"""The array-backend interface: the operations the three model families need.

Model code never calls numpy (or cupy, or pyopencl) on activations directly: it
calls these operations on the backend's opaque device arrays, so the same model
runs on every backend. Host-side logic (tokenisation, decoding rules, small
bookkeeping) uses numpy arrays obtained with :meth:`ArrayBackend.to_host`.

Conventions: activations are float32 unless stated; 1-D sequence layouts are
channels-first ``[batch, channels, time]`` for convolutions and
``[..., time, features]`` for linear layers and attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

Array = Any
"""An array living on the backend's device (numpy.ndarray, cupy.ndarray, pyopencl Array)."""


class ArrayBackend(Protocol):
    """Operations on device arrays. Implementations: numpy (reference), opencl, cuda.

    Operands whose shapes an op cannot take raise :class:`backends.shapes.ShapeError`
    (a ``ValueError`` naming the op and the shapes) on every backend.
    """

    name: str
    device: str

    # ---- transfer -------------------------------------------------------
    def to_device(self, host: np.ndarray, dtype: Any = np.float32) -> Array: ...
    def to_host(self, x: Array) -> np.ndarray: ...
    def zeros(self, shape: Sequence[int], dtype: Any = np.float32) -> Array: ...

    # ---- shape ----------------------------------------------------------
    def reshape(self, x: Array, shape: Sequence[int]) -> Array: ...
    def transpose(self, x: Array, axes: Sequence[int]) -> Array: ...
    def concat(self, xs: Sequence[Array], axis: int) -> Array: ...
    def slice(self, x: Array, axis: int, start: int, stop: int) -> Array: ...
    def pad(
        self, x: Array, axis: int, before: int, after: int, mode: str = "constant"
    ) -> Array: ...
    def take(self, x: Array, indices: np.ndarray, axis: int) -> Array:
        """Gather along ``axis`` by host int indices (embedding rows, flips, length regulation)."""
        ...

    def write_slice(self, dst: Array, axis: int, start: int, src: Array) -> None:
        """Copy ``src`` into ``dst`` in place at ``start`` along ``axis``.

        Used for preallocated KV caches.
        """
        ...

    # ---- elementwise ----------------------------------------------------
    def add(self, a: Array, b: Array) -> Array: ...
    def sub(self, a: Array, b: Array) -> Array: ...
    def mul(self, a: Array, b: Array) -> Array: ...
    def div(self, a: Array, b: Array) -> Array: ...
    def scale(self, x: Array, s: float) -> Array: ...
    def exp(self, x: Array) -> Array: ...
    def sqrt(self, x: Array) -> Array: ...
    def tanh(self, x: Array) -> Array: ...
    def sigmoid(self, x: Array) -> Array: ...
    def relu(self, x: Array) -> Array: ...
    def leaky_relu(self, x: Array, slope: float) -> Array: ...
    def gelu(self, x: Array) -> Array: ...

    # ---- reductions -----------------------------------------------------
    def sum(self, x: Array, axis: int, keepdims: bool = False) -> Array: ...
    def max(self, x: Array, axis: int, keepdims: bool = False) -> Array: ...
    def softmax(self, x: Array, axis: int = -1) -> Array: ...
    def log_softmax(self, x: Array, axis: int = -1) -> Array: ...

    # ---- linear algebra and layers -----------------------------------------
    def matmul(self, a: Array, b: Array) -> Array: ...
    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        """``x @ w.T + b`` with ``w`` of shape [out, in] (torch layout)."""
        ...

    def conv1d(
        self,
        x: Array,
        w: Array,
        b: Array | None = None,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
    ) -> Array:
        """``x`` [B, Cin, T], ``w`` [Cout, Cin/groups, K] (torch layout)."""
        ...

    def conv_transpose1d(
        self,
        x: Array,
        w: Array,
        b: Array | None = None,
        stride: int = 1,
        padding: int = 0,
        output_padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
    ) -> Array:
        """``x`` [B, Cin, T], ``w`` [Cin, Cout/groups, K] (torch layout)."""
        ...

    def layer_norm(
        self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5
    ) -> Array:
        """Normalise over the last axis."""
        ...

    def lstm_cell(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array]:
        """One LSTM step (torch gate order i, f, g, o); returns (h, c)."""
        ...

    def lstm_sequence(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array, Array]:
        """LSTM over ``x`` [T, B, In] from (h, c) [B, H]; returns (hs [T, B, H], h, c).

        Each batch row's result must not depend on the other rows (batch == sequential).
        """
        ...

    def attention(
        self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None
    ) -> Array:
        """softmax(q k^T * scale + mask) v over [..., T, D] tensors."""
        ...


OPS: frozenset[str] = frozenset(
    name for name, value in vars(ArrayBackend).items() if callable(value) and name[0] != "_"
)
"""The names of the interface's operations (every backend implements all of them)."""


def session_backend(backend: ArrayBackend) -> ArrayBackend:
    """The backend a new session should run on: its own queue/stream where the backend has them.

    OpenCL and CUDA backends ``fork()`` a view sharing the context and the
    uploaded weights with a private command queue or stream, so parallel slots
    really overlap on the device; numpy has no queues and is shared as is.
    """
    fork = getattr(backend, "fork", None)
    return fork() if fork is not None else backend
