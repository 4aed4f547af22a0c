"""The admission record: manifest, model checks, performance; and run_gate, the entry point."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import anyio

from server.families import registry
from server.provider import ThreadedProvider
from server.validation.gate import Gate
from server.validation.plans import (
    GROWTH_TOLERANCE_BYTES,
    MIN_STARTS,
    MIN_WAVES,
    PROCEDURE,
    ROOT,
    packages,
    plan,
    sha256,
)
from server.validation.probes import GateProvider


# --------------------------------------------------------------- manifest
def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def weight_files(family: str) -> dict[str, str]:
    """sha256 of every file the family's weights are read from (its entry's ``weights``)."""
    files = registry.family(family).weights
    paths = files() if files is not None else []
    return {p.name: sha256(p.read_bytes()) for p in paths if p.is_file()}


def source_identity() -> dict[str, Any]:
    """The candidate's identity: git commit, dirty flag, and a hash over its Python sources."""
    h = hashlib.sha256()
    for path in sorted(p for d in ("core", "backends", "server") for p in (ROOT / d).rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--", "core", "backends", "server")
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "sources_dirty": bool(status),
        "sources_sha256": h.hexdigest(),
    }


def manifest(gate: Gate) -> dict[str, Any]:
    from threadpoolctl import threadpool_info

    return {
        "family": gate.family,
        "task": registry.family(gate.family).task,
        "backend": "numpy",
        "device": "cpu",
        "precision": "float32 on host (weights as shipped, upcast on load)",
        "weights": weight_files(gate.family),
        "inputs": {c.name: c.meta for c in gate.cases},
        "stream_inputs": {c.name: c.meta for c in gate.plan.stream_cases()},
        "options": {
            "slots": gate.slots,
            "batching": gate.batching,
            "load_options": dict(gate.load_options),
            "starts": gate.starts,
            "waves": gate.waves,
            "busy_timeout_ms": 600_000,
            "stream_mode": gate.plan.stream_mode,
        },
        "candidate": source_identity(),
        "packages": {name: _version(name) for name in packages()},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "blas": [
            {k: i.get(k) for k in ("internal_api", "version", "num_threads")}
            for i in threadpool_info()
            if i.get("user_api") == "blas"  # not another library's OpenMP pool
        ],
    }


# --------------------------------------------------------------- record
def _ms(values: Sequence[float]) -> dict[str, Any]:
    return {
        "samples": len(values),
        "median_ms": round(1000 * statistics.median(values), 2) if values else None,
        "all_ms": [round(1000 * v, 2) for v in values],
    }


def performance(gate: Gate) -> dict[str, Any]:
    p = gate.perf
    if not p.get("candidate_n_slots"):
        return {"status": "pending"}

    def saved(base: str, cand: str) -> float:
        b, c = statistics.median(p[base]), statistics.median(p[cand])
        return round(100 * (b - c) / b, 1)

    return {
        "status": "completed",
        "workload": [gate.cases[i].name for i in gate.pick(gate.slots)],
        "base_one_request": _ms(p["original_one"]),
        "candidate_one_slot_one_request": _ms(p["candidate_one"]),
        "one_request_time_saved_pct": saved("original_one", "candidate_one"),
        "base_n_serial": _ms(p["original_serial_n"]),
        "candidate_one_slot_n_serial": _ms(p["candidate_serial_n"]),
        f"candidate_{gate.slots}_slots": _ms(p["candidate_n_slots"]),
        "n_requests_time_saved_pct": saved("original_serial_n", "candidate_n_slots"),
        "note": (
            "warm only (cold loads excluded); base = original runtime at one slot; "
            "separate from admission"
        ),
    }


def model_record(gate: Gate, reproduction: str) -> list[dict[str, Any]]:
    tested = {
        "family": gate.family,
        "backend": "numpy",
        "device": "cpu",
        "slots": gate.slots,
        "runtime": "parallel, batched (one engine; slots = batch capacity)"
        if gate.batching
        else "parallel",
    }
    limits = {
        "M1": [
            "no separate upstream C++ build: 'upstream' is the family's session called directly"
        ],
        "M2": [f"admits only {gate.slots} slots; lower counts need their own runs"],
        "M3": ["stateless per request: no per-session history requirement"],
        "M4": ["queue/timeout/eviction semantics are shared framework evidence (F1/F5)"],
        "M5": [
            "host RSS only (numpy backend, no device memory)",
            f"declared tolerance {GROWTH_TOLERANCE_BYTES // (1024 * 1024)} MiB for late growth",
        ],
        "M6": ["native batch mode is not admitted by this gate (NOT_APPLICABLE for batch)"],
    }
    if gate.batching:
        for cid in ("M1", "M2", "M3", "M6"):
            limits[cid].append(
                "batched: outputs compared with unbatched references, exactly or within the "
                f"family's declared batched tolerance ({gate.plan.batched_tolerance})"
            )
        limits["M2"].append(
            "batched: concurrency is n leases and n launched members at once; how many "
            "members each step carried is evidence (widest_batch_step), not a verdict"
        )
    gate.check("M6").evidence["offline"] = "M2/M3 waves (offline requests)"
    gate.check("M6").evidence["batch"] = (
        "NOT_APPLICABLE: not admitted here; batches stay with the framework tests"
    )
    rows = []
    for cid, c in gate.checks.items():
        evidence = dict(c.evidence)
        if c.failures:
            evidence["failures"] = c.failures[:50]
        if c.gaps:
            evidence["pending"] = c.gaps
        rows.append(
            {
                "id": cid,
                "title": c.title,
                "applicability": c.applicability,
                "status": c.status(),
                "tested": tested,
                "evidence": evidence,
                "reproduction": reproduction,
                "limitations": limits[cid] + c.limitations,
            }
        )
    return rows


@contextmanager
def one_share() -> Iterator[None]:
    """The process's core share (:data:`backends.parallel.SHARE`) held at one for the block,
    then cleared: a share an earlier runtime of this process left (its adaptive BLAS
    threads set it) would otherwise put the BLAS back at that count whenever a split or a
    one-thread section ends, under the gate's one-thread limit."""
    from backends import parallel

    parallel.SHARE.set_threads(1)
    try:
        yield
    finally:
        parallel.SHARE.set_threads(None)


def check_load_options(family: str, options: Mapping[str, Any]) -> None:
    """ValueError unless every option is one the family's loader accepts, with an allowed
    value (its registry entry's ``load_options``, as the server's config checks them)."""
    known = registry.family(family).load_options
    for key, value in options.items():
        if key not in known:
            raise ValueError(
                f"unknown load option {key!r} for family {family} (known: {', '.join(known)})"
            )
        allowed = known[key]
        if allowed is not None and value not in allowed:
            raise ValueError(f"load option {key} must be one of {', '.join(allowed)}")


def run_gate(
    family: str,
    slots: int,
    starts: int = MIN_STARTS,
    waves: int = MIN_WAVES,
    make_provider: Callable[[], GateProvider] | None = None,
    reproduction: str = "",
    batching: bool = False,
    load_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run M1-M6 for ``family`` at ``slots`` (BLAS at one thread); with ``batching``, the
    model is registered with ``batching: true`` (its batched engine, ``slots`` members);
    ``load_options``: the model's (checked against the family's, ValueError otherwise).

    Returns the record's model half. ValueError for a family without a plan, or, with
    ``batching``, without a batched engine.
    """
    from threadpoolctl import threadpool_limits

    options = dict(load_options or {})
    plan(family)  # ValueError for a family without a plan, before anything runs
    if batching and not registry.family(family).batching:
        raise ValueError(f"family {family!r} cannot batch across requests")
    check_load_options(family, options)
    gate = Gate(
        family,
        slots,
        starts,
        waves,
        make_provider or (lambda: GateProvider(ThreadedProvider())),
        batching,
        load_options=options,
    )
    t = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"), one_share():
        anyio.run(gate.run)
        info = manifest(gate)
    rss = gate.monitor.rss
    gate.check("M5").evidence.update(
        interval_ms=20,
        samples=len(rss),
        peak_mib=round(max((r for *_, r in rss), default=0) / 2**20, 2),
    )
    return {
        "procedure": PROCEDURE,
        "manifest": info,
        "model_checks": model_record(gate, reproduction),
        "performance": performance(gate),
        "elapsed_s": round(time.perf_counter() - t, 2),
    }
