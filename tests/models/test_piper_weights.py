"""Every weight the numpy Piper model reads is found in the ONNX graph, with its shape.

Some initializers are only reachable through the graph (weight-norm folded into
``onnx::Conv_*`` constants, the embedding exported as ``sid``, ``exp(-logs)``
folded): each must be resolved to its module by following the nodes.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from backends.piper.loader import (
    GraphWeights,
    Hyper,
    check_weights,
    expected_convs,
    expected_shapes,
    read_graph_weights,
    voice_paths,
)


@functools.cache
def _graph() -> onnx.GraphProto:
    return onnx.load(str(voice_paths()[0])).graph


@functools.cache
def _weights() -> GraphWeights:
    return read_graph_weights()


def test_every_needed_weight_is_found_with_its_shape() -> None:
    gw = _weights()
    needed = expected_shapes(Hyper())
    assert len(needed) == 350
    missing = sorted(set(needed) - set(gw.arrays))
    assert missing == []
    wrong = {n: gw.arrays[n].shape for n, s in needed.items() if gw.arrays[n].shape != s}
    assert wrong == {}
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in gw.arrays.values())
    assert set(gw.arrays) == set(needed)  # and nothing resolved that the model ignores
    assert check_weights(gw, Hyper()).keys() == needed.keys()


def test_graph_only_weights_are_mapped_by_following_nodes() -> None:
    gw = _weights()
    renamed = {name: src for name, src in gw.sources.items() if name != src}
    folded = sorted(src for src in renamed.values() if src.startswith("onnx::Conv_"))
    assert len(folded) == 32  # 4 coupling layers x 4 WaveNet layers x (in, res_skip)
    for i in (0, 2, 4, 6):
        for j in range(4):
            for kind in ("in_layers", "res_skip_layers"):
                assert renamed[f"flow.flows.{i}.enc.{kind}.{j}.weight"].startswith("onnx::Conv_")
    assert renamed["enc_p.emb.weight"] == "sid"
    assert renamed["dp.flows.0.exp_neg_logs"] == "/dp/flows.0/Exp_output_0"
    inits = {t.name: t for t in _graph().initializer}
    for name, src in renamed.items():
        np.testing.assert_array_equal(gw.arrays[name], numpy_helper.to_array(inits[src]))
    # each folded constant feeds exactly the Conv node its new name claims
    consumers = {n.input[1]: n.name for n in _graph().node if n.op_type == "Conv"}
    for src in folded:
        name = next(k for k, v in renamed.items() if v == src)
        node_module = consumers[src].removeprefix("/").removesuffix("/Conv").replace("/", ".")
        assert node_module == name.removesuffix(".weight")


def test_every_conv_node_is_resolved_and_matches_the_model_code() -> None:
    gw = _weights()
    conv_nodes = [n for n in _graph().node if n.op_type in ("Conv", "ConvTranspose")]
    assert len(gw.convs) == len(conv_nodes) == 129 + 3
    for module, attrs_ in expected_convs(Hyper()).items():
        assert gw.convs[module] == attrs_, module


def test_a_wrong_or_missing_weight_is_reported() -> None:
    gw = _weights()
    arrays = dict(gw.arrays)
    del arrays["dec.conv_post.weight"]
    arrays["enc_p.proj.bias"] = np.zeros(3, np.float32)
    broken = GraphWeights(arrays=arrays, sources=gw.sources, convs=gw.convs)
    with pytest.raises(ValueError) as error:
        check_weights(broken, Hyper())
    assert "missing dec.conv_post.weight" in str(error.value)
    assert "enc_p.proj.bias: shape (3,) != (384,)" in str(error.value)
