"""VITS inference for one sentence: phoneme ids -> float32 audio (the ONNX graph's function).

``PiperModel`` holds only immutable things (backend, device weights, config), so
any number of sessions can share one. Noise comes from the caller's RNG.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import attrs
import numpy as np

from backends import parallel
from backends.base import Array, ArrayBackend
from backends.piper import host
from backends.piper.api import FrameLimitError
from backends.piper.duration import log_durations
from backends.piper.flow import (
    flow_reverse,
    flow_reverse_host,
    prepare_couplings,
    prepare_flow,
    stack_couplings,
)
from backends.piper.generator import (
    PACK_GAP,
    generate,
    generate_host,
    prepare_generator,
    prepare_stages,
)
from backends.piper.loader import Hyper, VoiceConfig
from backends.piper.text_encoder import encode, encode_host, prepare_encoder
from backends.workspace import Workspaces


@attrs.frozen(eq=False)
class Synthesis:
    """Audio of one sentence plus the frame count per phoneme id (its alignment)."""

    audio: np.ndarray
    durations: np.ndarray


DECODER_PACK_FRAMES = 256
"""Most frames (about 3 s of audio) the HiFi-GAN takes in one packed batch: its arrays are
then about as large as one long sentence's (a larger pack spills out of the CPU caches)."""

WORKSPACE_SLOT_BYTES = 16 << 20
"""The most a workspace slot keeps (:class:`backends.workspace.Workspace`): the HiFi-GAN's
last stage (32 channels at the audio rate, two slots) of a sentence or packed batch of up
to 5.9 s of audio (131,072 samples) reuses its pages; a longer one allocates its arrays
for that call. Kept: at most 32 MB a caller decoding at the same time."""


@attrs.frozen(eq=False)
class SynthesisInput:
    """One sentence to synthesize: :meth:`PiperModel.synthesize_ids`'s arguments."""

    phoneme_ids: np.ndarray
    noise_scale: float
    length_scale: float
    noise_w: float
    rng: np.random.Generator
    max_frames: int | None = None


@attrs.frozen(eq=False)
class Latent:
    """A sentence whose latent was computed ahead (:meth:`PiperModel.latent`): only its flow
    and HiFi-GAN remain, and they draw no noise."""

    z_p: Array
    durations: np.ndarray


@attrs.frozen(eq=False)
class PiperModel:
    """Shared, immutable: the backend, the weights uploaded once, the voice config."""

    backend: ArrayBackend
    weights: Mapping[str, Array]
    config: VoiceConfig
    hyper: Hyper = attrs.field(factory=Hyper)
    prepared: host.Prepared | None = attrs.field(init=False, repr=False)
    """The text encoder's, flow's and generator's convs as fused-conv operands on the numpy
    backend (None elsewhere), built once per model."""
    workspaces: Workspaces = attrs.field(init=False, repr=False)
    """The HiFi-GAN's full-rate arrays on the host path, kept from call to call (one workspace
    a caller decoding at the same time: :mod:`backends.workspace`)."""

    @workspaces.default
    def _workspaces(self) -> Workspaces:
        return Workspaces(WORKSPACE_SLOT_BYTES)

    @prepared.default
    def _prepare(self) -> host.Prepared | None:
        if not host.is_host(self.backend):
            return None
        w, h = self.weights, self.hyper
        convs, ups = prepare_generator(w, h)
        stages = prepare_stages(convs, h)
        convs_all = {**prepare_encoder(w, h), **prepare_flow(w, h), **convs}
        couplings = prepare_couplings(convs_all, h)
        stacked = stack_couplings(couplings, convs_all, h)
        return host.Prepared(convs_all, ups, stages, couplings, stacked)

    def synthesize_ids(
        self,
        phoneme_ids: np.ndarray,
        noise_scale: float,
        length_scale: float,
        noise_w: float,
        rng: np.random.Generator,
        backend: ArrayBackend | None = None,
        max_frames: int | None = None,
    ) -> Synthesis:
        """Same inputs as the ONNX model (ids and scales); noise drawn from ``rng``.

        ``backend`` is the calling session's view (its own queue); default: the model's.
        ``max_frames`` bounds the output (``hop_length`` samples a frame) and so the
        memory: every id gets at least one frame, so more ids than that fail before the
        encoder, and more predicted frames fail before the flow and vocoder
        (:class:`FrameLimitError`).
        """
        be = backend or self.backend
        item = SynthesisInput(phoneme_ids, noise_scale, length_scale, noise_w, rng, max_frames)
        z_p, durations = self.latent(be, item)
        return Synthesis(audio=self.decode_one(be, z_p), durations=durations)

    def synthesize_batch(
        self, items: Sequence[SynthesisInput | Latent], backend: ArrayBackend | None = None
    ) -> list[Synthesis | Exception]:
        """Several sentences at once; each result as :meth:`synthesize_ids` gives it alone
        (a :class:`Latent` item: as :meth:`decode_one` decodes it).

        Each item's text encoder and duration predictor run on their own (noise is
        drawn from the item's RNG in the unbatched order: durations' noise, then the
        flow's). On the numpy backend the flow and the HiFi-GAN then run once over a
        packed batch: the items' frames end to end, :data:`PACK_GAP` zero frames
        apart (masked before every conv, :func:`backends.piper.host.zero_gaps`), so
        every item's audio is its own, equal to the unbatched audio up to float32
        summation order. With several cores (:mod:`backends.parallel`'s share) the
        items are dealt into one group a core (:func:`core_groups`), each group's
        encoders and packed batch on its core: one pack over both cores ran 1.7x its
        one-core time, the encoders of a wave one after another (8 texts, 2 cores:
        3.1 s against 3.5). The groups follow the share, so an item's audio may
        differ in the last bits between shares (within the batch's tolerance, as
        across thread counts). Items sharing one RNG stay in one group, in order (their
        noise is drawn in the items' order). Elsewhere the items are decoded one
        after another. An item that fails (bad ids, :class:`FrameLimitError`) gets
        its exception and is left out; the others go on.
        """
        be = backend or self.backend
        out: list[Synthesis | Exception | None] = [None] * len(items)
        rngs = [item.rng for item in items if isinstance(item, SynthesisInput)]
        shared_rng = len(set(rngs)) < len(rngs)  # by identity
        host_path = self._on_host(be) is not None
        cores = parallel.SHARE.share() if host_path and not shared_rng else 1
        parallel.run_pieces(
            lambda group: self._synthesize_group(be, items, group, out),
            core_groups([_phonemes(item) for item in items], cores),
        )
        done = [o for o in out if o is not None]
        if len(done) != len(items):
            raise RuntimeError("piper: an item of the batch was not synthesized")
        return done

    def _synthesize_group(
        self,
        be: ArrayBackend,
        items: Sequence[SynthesisInput | Latent],
        group: Sequence[int],
        out: list[Synthesis | Exception | None],
    ) -> None:
        """:meth:`synthesize_batch` of ``items[i] for i in group``, written to ``out[i]``."""
        latents: list[tuple[int, Array, np.ndarray]] = []
        for i in group:
            item = items[i]
            if isinstance(item, Latent):
                latents.append((i, item.z_p, item.durations))
                continue
            try:
                z_p, durations = self.latent(be, item)
            except Exception as error:  # this item only
                out[i] = error
                continue
            latents.append((i, z_p, durations))
        if self._on_host(be) is not None and len(latents) > 1:
            audio = self._decode_packed([z_p[0] for _, z_p, _ in latents])
        else:
            audio = [self.decode_one(be, z_p) for _, z_p, _ in latents]
        for (i, _, durations), a in zip(latents, audio, strict=True):
            out[i] = Synthesis(audio=a, durations=durations)

    # ---- internals ----------------------------------------------------------
    def _on_host(self, be: ArrayBackend) -> host.Prepared | None:
        """The prepared convs where ``be`` runs the fused host paths (numpy: packed batches,
        tiles and groups of items on the cores), else None."""
        return self.prepared if host.is_host(be) else None

    def latent(self, be: ArrayBackend, item: SynthesisInput) -> tuple[Array, np.ndarray]:
        """Checks, text encoder, durations and the prior sample: (z_p [1, C, T'], durations)."""
        w, h, rng = self.weights, self.hyper, item.rng
        ids = np.asarray(item.phoneme_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("no phoneme ids")
        if ids.min() < 0 or ids.max() >= h.n_vocab:
            raise ValueError(f"phoneme ids must be in [0, {h.n_vocab})")
        t = int(ids.size)
        max_frames = item.max_frames
        if max_frames is not None and t > max_frames:
            raise FrameLimitError(t, max_frames)
        dp_noise = rng.standard_normal((1, 2, t), dtype=np.float32) * np.float32(item.noise_w)
        prepared = self._on_host(be)
        lanes = parallel.SHARE.share()  # read outside the block, where it is 1
        with _small_products(be):
            if prepared is not None:
                x, m, logs = encode_host(prepared.convs, w, h, ids, lanes)
            else:
                x, m, logs = encode(be, w, h, ids)
            logw = log_durations(be, w, h, x, dp_noise)
        durations = np.ceil(np.exp(logw) * np.float32(item.length_scale)).astype(np.int64)
        frames = max(int(durations.sum()), 1)
        if max_frames is not None and frames > max_frames:
            raise FrameLimitError(frames, max_frames)
        if durations.sum() > 0:
            index = np.repeat(np.arange(t), durations)
            m = be.take(m, index, 2)
            logs = be.take(logs, index, 2)
        else:  # no phoneme got a frame: the path matrix is all zero
            m = be.zeros((1, h.inter, 1))
            logs = be.zeros((1, h.inter, 1))
        noise = be.to_device(rng.standard_normal((1, h.inter, frames), dtype=np.float32))
        z_p = be.add(m, be.scale(be.mul(noise, be.exp(logs)), item.noise_scale))
        return z_p, durations

    def _flow_host(self, z_p: np.ndarray, gaps: host.Gaps) -> np.ndarray:
        assert self.prepared is not None
        prepared = self.prepared
        return flow_reverse_host(
            prepared.convs, self.hyper, z_p, gaps, prepared.couplings, prepared.flow
        )

    def decode_one(self, be: ArrayBackend, z_p: Array) -> np.ndarray:
        """Flow and HiFi-GAN of one latent [1, C, T'] -> audio [T' * hop] (host float32)."""
        prepared = self._on_host(be)
        if prepared is not None:
            z = self._flow_host(z_p[0], ())
            with self.workspaces.taken() as work:
                audio = generate_host(prepared, self.hyper, z, work=work)
        else:
            z = flow_reverse(be, self.weights, self.hyper, z_p)
            audio = be.to_host(generate(be, self.weights, self.hyper, z)).reshape(-1)
        return audio.astype(np.float32, copy=False)

    def _decode_packed(self, latents: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Flow and HiFi-GAN of host latents [C, T'_i] as packed batches -> each one's audio.

        The flow runs once over all of them; the HiFi-GAN over consecutive groups of
        at most :data:`DECODER_PACK_FRAMES` frames (a longer latent alone), so that
        its full-rate arrays stay about as large as one long sentence's.
        """
        assert self.prepared is not None
        packed, starts, gaps = _pack(latents)
        z = self._flow_host(packed, gaps)
        zs = [
            z[:, start : start + lat.shape[1]] for start, lat in zip(starts, latents, strict=True)
        ]
        hop = self.hyper.hop_length
        audio: list[np.ndarray] = []
        for group in _groups(zs, DECODER_PACK_FRAMES):
            packed, starts, gaps = _pack(group)
            with self.workspaces.taken() as work:
                wave = generate_host(self.prepared, self.hyper, packed, gaps, work)
            audio += [
                wave[start * hop : (start + g.shape[1]) * hop].copy()
                for start, g in zip(starts, group, strict=True)
            ]
        return audio


def _phonemes(item: SynthesisInput | Latent) -> int:
    """An item's size for :func:`core_groups`: its phoneme ids (a latent has a duration each).
    A proxy for a latent, whose flow and HiFi-GAN scale with its frames (about 2-2.6 a
    phoneme with this voice): groups mixing latents and inputs balance less exactly."""
    return len(item.durations if isinstance(item, Latent) else item.phoneme_ids)


def core_groups(sizes: Sequence[int], cores: int) -> list[list[int]]:
    """The indices of items of ``sizes`` (phonemes) dealt into at most ``cores`` groups of
    about equal total size (the largest first, each to the smallest group so far; ties to
    the lower index), each group in the items' order. A function of the sizes and the
    count only: the same wave on the same share is grouped the same way in every run."""
    n = max(1, min(cores, len(sizes)))
    groups: list[list[int]] = [[] for _ in range(n)]
    totals = [0] * n
    for i in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        g = min(range(n), key=lambda k: (totals[k], k))
        groups[g].append(i)
        totals[g] += sizes[i]
    return [sorted(g) for g in groups if g]


@contextlib.contextmanager
def _small_products(be: ArrayBackend) -> Iterator[None]:
    """Where the text encoder and the duration predictor run: on the numpy backend on one
    core, with one BLAS thread (:func:`backends.parallel.one_thread`) and no split over
    the cores (:func:`backends.parallel.sequential`). Their products have a sentence's
    phonemes as columns (tens to a few hundred): OpenBLAS's threads gain little on them
    and lose much when a sleeping BLAS thread's core is busy (short sentence, two
    threads, one other job: encoder 157 ms against 36 on one thread), and tiles handed
    to the cores cost more than they save (see :func:`backends.parallel.sequential`).
    Only the text encoder's convs take the caller's other cores, by pieces of output
    rows handed to spinning helpers (:func:`backends.piper.blas.conv_rows`: a late core
    takes no piece instead of holding the others up). Elsewhere nothing changes."""
    if not host.is_host(be):
        yield
        return
    with parallel.one_thread(), parallel.sequential():
        yield


def _pack(latents: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int], list[tuple[int, int]]]:
    """Latents [C, T'_i] end to end, :data:`PACK_GAP` zero frames apart: (packed, starts, gaps)."""
    starts, gaps, at = [], [], 0
    for i, z in enumerate(latents):
        if i:
            gaps.append((at, at + PACK_GAP))
            at += PACK_GAP
        starts.append(at)
        at += z.shape[1]
    packed = np.zeros((latents[0].shape[0], at), np.float32)
    for start, z in zip(starts, latents, strict=True):
        packed[:, start : start + z.shape[1]] = z
    return packed, starts, gaps


def _groups(latents: Sequence[np.ndarray], frames: int) -> list[list[np.ndarray]]:
    """Consecutive groups of latents of at most ``frames`` frames in all (one at least)."""
    out: list[list[np.ndarray]] = []
    total = 0
    for z in latents:
        if out and total + PACK_GAP + z.shape[1] <= frames:
            out[-1].append(z)
            total += PACK_GAP + z.shape[1]
        else:
            out.append([z])
            total = z.shape[1]
    return out
