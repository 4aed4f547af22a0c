"""Reader for CTranslate2's ``model.bin`` (binary version 6), without ctranslate2.

The file is little-endian and sequential (see ``ctranslate2/specs/model_spec.py``,
``ModelSpec._serialize``)::

    u32  binary version (6; this reader accepts 5 and 6)
    str  spec name                      e.g. "WhisperSpec"
    u32  spec revision                  e.g. 3
    u32  number of variables
    per variable:
        str  name                       scope path, e.g. "encoder/layer_0/ffn/linear_0/weight"
        u8   rank, then rank x u32 dims (rank 0 = scalar)
        u8   dtype id: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16
        u32  byte count, then the raw row-major bytes
    u32  number of aliases
    per alias: str alias name, str target name  (a shared tensor stored once,
               e.g. "decoder/projection/weight" -> "decoder/embeddings/weight")

    str = u16 length including a trailing NUL, then UTF-8 bytes and the NUL.

The model's ``config.json`` (suppress ids, alignment heads, ...) sits next to
``model.bin`` and is plain JSON. Float16/bfloat16 tensors are converted to
float32 once here, so every session shares the float32 copies. Quantized
(int8/int16 "weight_scale") models are not supported: the Whisper files we ship
are float16.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

_DTYPES: dict[int, Any] = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
    5: "bfloat16",
}


@attrs.frozen
class Ct2Model:
    """The decoded contents of a CTranslate2 model directory."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]
    config: dict[str, Any]

    def get(self, name: str) -> np.ndarray:
        """A variable by name, following aliases."""
        return self.variables[self.aliases.get(name, name)]


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        size = self.unpack("H")
        raw = self.data[self.pos : self.pos + size - 1]
        self.pos += size
        return raw.decode("utf-8")

    def take(self, size: int) -> memoryview:
        view = memoryview(self.data)[self.pos : self.pos + size]
        self.pos += size
        return view


def _decode(raw: memoryview, dtype_id: int, shape: tuple[int, ...]) -> np.ndarray:
    kind = _DTYPES.get(dtype_id)
    if kind is None:
        raise ValueError(f"unknown CTranslate2 dtype id {dtype_id}")
    if kind == "bfloat16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    array = np.frombuffer(raw, dtype=np.dtype(kind).newbyteorder("<")).reshape(shape)
    if kind == np.float16:
        return array.astype(np.float32)
    return array.copy()


def read_ct2_model(model_dir: str | Path) -> Ct2Model:
    """Read ``model.bin`` and ``config.json`` from ``model_dir``; floats become float32."""
    model_dir = Path(model_dir)
    cursor = _Cursor((model_dir / "model.bin").read_bytes())
    version = cursor.unpack("I")
    if version not in (5, 6):
        raise ValueError(f"unsupported CTranslate2 binary version {version}")
    spec = cursor.string()
    revision = cursor.unpack("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(cursor.unpack("I")):
        name = cursor.string()
        shape = tuple(cursor.unpack("I") for _ in range(cursor.unpack("B")))
        dtype_id = cursor.unpack("B")
        raw = cursor.take(cursor.unpack("I"))
        variables[name] = _decode(raw, dtype_id, shape)
    aliases = {}
    for _ in range(cursor.unpack("I")):
        alias = cursor.string()
        aliases[alias] = cursor.string()
    if cursor.pos != len(cursor.data):
        raise ValueError("trailing bytes after the CTranslate2 alias table")
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    return Ct2Model(
        spec=spec, revision=revision, variables=variables, aliases=aliases, config=config
    )
