"""Assemble a server from a configuration: provider, runtime, metrics, trace, app."""

from __future__ import annotations

from typing import IO

from starlette.types import ASGIApp

from server.blas import AdaptiveThreads, cores
from server.config import ServerConfig
from server.http.app import build_app
from server.http.state import ServerState
from server.metrics import Metrics
from server.provider import ThreadedProvider
from server.runtime import ModelProvider, Runtime, RuntimeConfig
from server.runtime.tracing import TraceLog


def adaptive_threads(threads: int | None) -> AdaptiveThreads | None:
    """The provider's thread policy: adaptive when the config's ``threads`` is ``"auto"``."""
    return AdaptiveThreads(cores()) if threads is None else None


def make_state(
    config: ServerConfig, provider: ModelProvider | None = None, trace_out: IO[str] | None = None
) -> ServerState:
    """The runtime with every configured model registered (lazily).

    Metrics are wired to its decisions.
    """
    log = TraceLog(trace_out, keep=False) if trace_out is not None else None
    metrics_box: list[Metrics] = []

    def sink(record):  # type: ignore[no-untyped-def]
        if log is not None:
            log(record)
        if metrics_box:
            metrics_box[0].observe(record)

    runtime = Runtime(
        provider or ThreadedProvider(threads=adaptive_threads(config.threads)),
        RuntimeConfig(
            busy_timeout_ms=config.busy_timeout_ms,
            max_loaded_models=config.max_loaded_models,
            memory_budget=config.memory_budget_mb * 1024 * 1024,
            max_queue=config.max_queue,
            idle_unload_ms=config.idle_unload_ms,
            kind=config.runtime,
        ),
        trace=sink,
    )
    metrics = Metrics(runtime.status)
    metrics_box.append(metrics)
    for model in config.models:
        runtime.add_model(model.spec())
    return ServerState(config=config, runtime=runtime, metrics=metrics, backend=config.backend)


def make_app(
    config: ServerConfig, provider: ModelProvider | None = None, trace_out: IO[str] | None = None
) -> ASGIApp:
    return build_app(make_state(config, provider, trace_out))
