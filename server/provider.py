"""The production model provider: real families, shared weights, worker threads.

Families are looked up in the family registry (:mod:`server.families.registry`):
each entry names its backend module, which exposes ``load_factory(backend,
**options)``, and maps a model's spec to its keywords. Loaded factories (the
immutable weights) are shared by every model whose weight key matches, through core's
single-flight, reference-counted :class:`~core.weights.WeightCache`; the last
release frees them. Session work runs in worker threads so the event loop
never blocks on compute.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import anyio
import anyio.to_thread

from core.engine import BatchEngine, BatchingFactory, Emitted, Member
from core.pool import Session, SessionFactory
from core.weights import Free, Hit, Loaded, StartLoad, Wait, WeightCache, WeightKey
from server import gc_policy
from server.blas import AdaptiveThreads
from server.families import registry
from server.runtime.ports import ModelSpec

_END = object()


def make_backend(name: str, device: str) -> Any:
    """The array backend called ``name`` on ``device``."""
    if name in ("numpy", "cpu"):
        from backends.numpy_backend import NumpyBackend

        return NumpyBackend()
    module = importlib.import_module(f"backends.{name}_backend")
    return module.make_backend(device)


class BackendUnavailable(RuntimeError):
    """A configured backend or device cannot run on this machine (a startup error)."""


def check_backends(specs: Iterable[ModelSpec]) -> None:
    """Fail fast, before serving, when a model's backend or device cannot run here.

    Models load lazily, so without this a server whose OpenCL device cannot build
    kernels would start and fail every first request. Backend modules may define
    ``check_device(device)``, which raises when the device cannot be used; it is
    called once per distinct (backend, device). Raises :class:`BackendUnavailable`
    with a one-line message naming the models, the backend and the cause.
    """
    users: dict[tuple[str, str], list[str]] = {}
    for spec in specs:
        if spec.backend not in ("numpy", "cpu"):
            users.setdefault((spec.backend, spec.device), []).append(spec.id)
    for (name, device), models in users.items():
        where = f"model(s) {', '.join(models)}: backend {name!r} device {device!r}"
        try:
            module = importlib.import_module(f"backends.{name}_backend")
        except ImportError as exc:
            raise BackendUnavailable(f"{where}: not installed ({exc})") from exc
        check = getattr(module, "check_device", None)
        if check is None:
            continue
        try:
            check(device)
        except (RuntimeError, ValueError) as exc:
            message = " ".join(str(exc).split())
            raise BackendUnavailable(f"{where}: {message}") from exc


def weight_key(spec: ModelSpec) -> WeightKey:
    """The weight cache's key for ``spec``: :meth:`ModelSpec.weight_key` as a cache key."""
    family, path, mode, backend, device, options = spec.weight_key()
    source = f"{family}:{path}:{mode}:" + ",".join(f"{k}={v}" for k, v in options)
    return WeightKey(source=source, backend=backend, device=device)


class ThreadedProvider:
    """ModelProvider for real models."""

    def __init__(
        self,
        limiter: anyio.CapacityLimiter | None = None,
        threads: AdaptiveThreads | None = None,
    ) -> None:
        self.cache: WeightCache[SessionFactory] = WeightCache()
        self.limiter = limiter
        self.threads = threads
        self._users = itertools.count(1)
        self._holders: dict[WeightKey, list[int]] = {}
        self._loaded: dict[WeightKey, anyio.Event] = {}
        self._errors: dict[WeightKey, str] = {}

    async def _thread(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` in a worker thread; with adaptive threads, at its share of the cores."""
        if self.threads is None:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)
        self.threads.enter()
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)
        finally:
            self.threads.leave()

    def _load_sync(self, spec: ModelSpec) -> SessionFactory:
        entry = registry.family(spec.family)
        module = importlib.import_module(entry.backend)
        options = entry.load_kwargs(spec.mode, spec.path, spec.load_options)
        backend = make_backend(spec.backend, spec.device)
        factory: SessionFactory = module.load_factory(backend, **options)
        gc_policy.settle()  # the model's objects (and the imports) out of every collection
        return factory

    async def load(self, spec: ModelSpec) -> SessionFactory:
        key = weight_key(spec)
        user = next(self._users)
        while True:
            decision = self.cache.acquire(key, user)
            if isinstance(decision, Hit):
                return self._remember(decision.handle, key, user)
            if isinstance(decision, Wait):
                event = self._loaded.setdefault(key, anyio.Event())
                await event.wait()
                error = self._errors.get(key)
                if error is not None and self.cache.state(key) is None:
                    raise RuntimeError(error)
                continue
            if isinstance(decision, StartLoad):
                event = self._loaded.setdefault(key, anyio.Event())
                try:
                    factory = await self._thread(self._load_sync, spec)
                except Exception as exc:
                    self._errors[key] = str(exc)
                    self.cache.load_failed(key, exc)
                    self._loaded.pop(key, None)
                    event.set()
                    raise
                self._errors.pop(key, None)
                loaded = self.cache.load_succeeded(key, factory)
                assert isinstance(loaded, Loaded)
                self._loaded.pop(key, None)
                event.set()
                return self._remember(factory, key, user)
            raise RuntimeError(f"weight cache refused: {decision}")

    def _remember(self, factory: SessionFactory, key: WeightKey, user: int) -> SessionFactory:
        self._holders.setdefault(key, []).append(user)
        return factory

    async def release(self, spec: ModelSpec, factory: SessionFactory) -> None:
        key = weight_key(spec)
        users = self._holders.get(key, [])
        if not users:
            return
        decision = self.cache.release(key, users.pop(0))
        if isinstance(decision, Free):
            close = getattr(decision.handle, "close", None)
            if close is not None:
                await self._thread(close)

    async def create(self, factory: SessionFactory) -> Session:
        session: Session = await self._thread(factory.create)
        return session

    async def clone(self, factory: SessionFactory, primary: Session) -> Session:
        session: Session = await self._thread(factory.clone, primary)
        return session

    async def close(self, session: Session) -> None:
        await self._thread(session.close)

    async def run(self, session: Session, request: Any) -> Any:
        return await self._thread(session.run, request)

    async def stream(self, session: Session, request: Any) -> AsyncIterator[Any]:
        iterator = await self._thread(lambda: iter(session.stream(request)))
        while True:
            chunk = await self._thread(next, iterator, _END)
            if chunk is _END:
                return
            yield chunk

    async def batch(self, session: Session, requests: Sequence[Any]) -> list[Any]:
        results: list[Any] = await self._thread(session.batch, list(requests))
        return results

    async def reset(self, session: Session) -> None:
        await self._thread(session.reset)

    # ------------------------------------------------------------ batching
    async def engine(self, factory: SessionFactory, max_batch: int) -> BatchEngine:
        if not isinstance(factory, BatchingFactory):
            raise ValueError(f"family '{factory.family}' has no batched engine")
        engine: BatchEngine = await self._thread(factory.engine, max_batch)
        return engine

    async def join(self, engine: BatchEngine, members: Sequence[Member]) -> list[Emitted]:
        emitted: list[Emitted] = await self._thread(engine.join, list(members))
        return emitted

    async def step(self, engine: BatchEngine, keys: Sequence[int]) -> list[Emitted]:
        emitted: list[Emitted] = await self._thread(engine.step, list(keys))
        return emitted

    async def leave(self, engine: BatchEngine, key: int) -> None:
        """On the event loop, not a worker thread: a leave only drops the member's rows
        (the engine's contract), and the driver makes no other engine call meanwhile, so
        the hop would cost a lone request more than the leave (a 3.5 s VAD file alone
        through a batching model: 1.07 of a session's time with it, 1.04-1.05 without)."""
        engine.leave(key)

    async def close_engine(self, engine: BatchEngine) -> None:
        await self._thread(engine.close)
