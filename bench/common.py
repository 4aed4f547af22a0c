"""Helpers shared by the benchmarks."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def machine() -> str:
    """One line naming what the figures depend on: the CPU, the BLAS numpy runs and its
    kernel set, and an ``OPENBLAS_CORETYPE`` forcing that set (server.blas.kernels_note)."""
    import platform

    import numpy  # noqa: F401  (loads its BLAS)
    from threadpoolctl import threadpool_info

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            first = f.read().split("\n\n")[0]
    except OSError:
        first = ""
    fields = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in first.splitlines())}
    if fields:
        family, model = fields.get("cpu family"), fields.get("model")
        cpu = f"{fields.get('model name', cpu)} (family {family}, model {model})"
    blas = [
        f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} kernels"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"machine: {cpu}, {os.cpu_count()} CPUs; blas: {', '.join(blas) or 'none found'}" + (
        f" (OPENBLAS_CORETYPE={forced})" if forced else ""
    )


@contextmanager
def blas_threads(threads: int) -> Iterator[None]:
    """Limit BLAS (and OpenMP) threads for the block; without threadpoolctl the environment
    decides."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - then OMP/OPENBLAS_NUM_THREADS decide
        yield
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def array_backend(name: str) -> object:
    """The array backend called ``name`` (numpy, opencl, cuda) on its first device."""
    from server.provider import make_backend

    return make_backend(name, "0")


def markdown_table(rows: Sequence[Mapping[str, object]]) -> str:
    """``rows`` (dicts with the same keys) as a Markdown table, keys as the header."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def serve_config(config: Mapping[str, Any], path: Path) -> Any:
    """A real ``voxpool serve`` on ``config`` (written to ``path``; its log beside it), with
    the BLAS threads the config's ``threads`` says: tests.server.live.LiveServer pins one
    BLAS thread unless the environment names a count, so the pin is lifted while it starts.
    Returns the started LiveServer (the caller stops it)."""
    from tests.server.live import LiveServer

    path.write_text(json.dumps(config))
    pinned = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = ""
    try:
        return LiveServer(path, path.parent).start()
    finally:
        if pinned is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = pinned


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def served_model(family: str, threads: int) -> Iterator[tuple[Any, Callable[[], float]]]:
    """A real, otherwise idle ``voxpool serve`` with one model of ``family`` (its id the
    family's name, one slot, ``threads`` BLAS threads a call) on loopback: yields (an
    ``httpx.Client`` on it, the server process's CPU seconds so far)."""
    import httpx

    logs = Path(tempfile.mkdtemp(prefix=f"voxpool-{family}-http-"))
    config = {
        "busy_timeout_ms": 0,
        "threads": threads,
        "models": [{"id": family, "family": family, "slots": 1}],
    }
    server = serve_config(config, logs / f"{family}-{threads}.json")
    assert server.proc is not None
    pid = server.proc.pid
    try:
        with httpx.Client(base_url=server.url, timeout=600.0) as client:
            yield client, lambda: process_cpu(pid)
    finally:
        server.stop()
