"""The HiFi-GAN's stage arrays come from the model's workspaces: the same pages every call,
never a different sample (docs/performance.md, "Session 23")."""

from __future__ import annotations

import functools
import resource

import numpy as np
import pytest

from backends.piper import PiperFactory, PiperModel, PiperRequest, load_model
from backends.piper.generator import generate_host
from backends.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_blas_thread")


@functools.cache
def _model() -> PiperModel:
    return load_model()


def _latent(frames: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((_model().hyper.inter, frames), dtype=np.float32)


def test_a_workspaces_leftovers_never_reach_the_audio() -> None:
    model = _model()
    assert model.prepared is not None
    z = _latent(40, 1)
    fresh = generate_host(model.prepared, model.hyper, z.copy())
    work = Workspace(1 << 30)
    longer = generate_host(model.prepared, model.hyper, _latent(57, 2), work=work)
    kept = work.kept_bytes
    last = model.prepared.ups[f"dec.ups.{len(model.hyper.upsample_rates) - 1}"].c_out
    for slot in ("stage", "ups"):  # both slots' largest array: the last stage's; NaN in it
        work.take(slot, (last, longer.size))[...] = np.nan
    assert work.kept_bytes == kept
    again = generate_host(model.prepared, model.hyper, z.copy(), work=work)
    np.testing.assert_array_equal(again, fresh)
    assert work.kept_bytes == kept > 0  # the shorter call fit the buffers the longer one left
    gapped = generate_host(model.prepared, model.hyper, z.copy(), [(10, 22)], work)
    np.testing.assert_array_equal(gapped, generate_host(model.prepared, model.hyper, z, [(10, 22)]))


def test_a_sentence_decoded_again_takes_no_new_pages() -> None:
    """The generator's arrays were about 2,000 page faults a short sentence when allocated
    afresh; from the model's workspace the second sentence maps (almost) nothing new."""
    factory = PiperFactory(load_model())  # its own model: its own workspaces
    session = factory.create()
    request = PiperRequest("Hello world, this is a test.", seed=3)
    first = session.run(request)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = session.run(request)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    np.testing.assert_array_equal(second.audio, first.audio)
    assert factory.model.workspaces.made == 1
    assert faults < 200, faults
