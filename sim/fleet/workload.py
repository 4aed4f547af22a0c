"""Fleet workloads: the one reader of the TOML format, with errors that name the field.

A workload says what traffic arrives, what models it asks for, what each replica
holds, how the router and the autoscaler behave, and what goes wrong when.
Format (every field optional unless marked)::

    name = "two models, one hot"
    description = "why this workload exists"
    seed = 1                       # the default seed (--seed overrides)
    duration_s = 600.0             # arrivals stop at this virtual time (required
                                   # unless a trace is given)
    requests = 0                   # stop after this many arrivals (0: no cap)
    scheduling = "together"        # one_at_a_time | together (sim.clock.Scheduling);
                                   # omitted, the seed chooses
    trace = "arrivals.csv"         # arrivals from a file instead of Poisson rates:
                                   # one "at,model[,duration]" line each, relative
                                   # to the workload file

    [replicas]
    count = 4                      # replicas at start (required; 0 only with autoscaling)
    max_ongoing_requests = 4       # Ray's per-replica cap (default: as voxpool's Ray
                                   # deployment derives it, every model's slots plus
                                   # its queue bound, max_queue or else its slots)
    start_time_s = 10.0            # how long a new replica takes to start
    graceful_shutdown_timeout_s = 20.0  # a stopped replica's drain; then its requests fail
    max_loaded_models = 2          # the runtime's residency limits (0: none)
    memory_budget = 0
    busy_timeout_ms = 0            # the runtime's server busy timeout (0: none)
    max_queue = 2                  # the runtime's queue bound per model (omit: none)

    [router]
    max_queued_requests = -1       # Ray's caller-side queue bound (-1: none) -> 503
    retries = 2                    # a replica's 503, or a request whose replica died,
                                   # tried again (voxpool's Ray ingress's "retries")
    multiplex_timeout_s = 1.0      # Ray's multiplexed-model matching timeout
    backoff_initial_s = 0.025      # Ray's routing backoff
    backoff_multiplier = 2.0
    backoff_max_s = 0.5
    hop_s = 0.0                    # the time a try spends between the client and a
                                   # replica outside the runtime (HTTP proxy, ingress,
                                   # handle, the answer's way back): before the first
                                   # try is routed, and again before each retry

    [autoscaling]                  # omit for a fixed fleet
    min_replicas = 1
    max_replicas = 10
    target_ongoing_requests = 2.0  # default: every model's slots (as the deployment)
    upscale_delay_s = 30.0
    downscale_delay_s = 600.0
    look_back_period_s = 30.0
    interval_s = 0.1               # Ray's controller loop period
    upscaling_factor = 1.0
    downscaling_factor = 1.0

    [[models]]
    id = "asr"                     # required
    slots = 2
    memory = 0                     # bytes, counted against memory_budget
    load_time_s = 2.0
    rate = 3.0                     # Poisson arrivals per second
    busy_timeout_ms = 0            # the model's busy timeout (0: the replica's)
    duration = 0.8                 # a fixed time, or a list of measured seconds
                                   # (drawn uniformly), or a table:
                                   # { dist = "exponential", mean = 0.8 }
                                   # { dist = "normal", mean = 0.8, sd = 0.1 }
                                   # { dist = "lognormal", mean = 0.8, sd = 0.3 }

    [[phases]]                     # new rates from a time on (a hot model moves)
    at = 300.0
    rates = { asr = 1.0, tts = 8.0 }

    [[events]]
    at = 120.0
    kill = 2                       # replica 2 dies (its in-flight requests fail)
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from core.policy import ongoing_bounds
from sim.clock import Scheduling


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the field."""


MIN_DURATION = 1e-6
"""Drawn durations are clamped to at least this (a normal draw can be negative)."""

DISTRIBUTIONS = ("fixed", "exponential", "normal", "lognormal", "samples")


@attrs.frozen
class Duration:
    """How long one request runs on its session (virtual seconds), as a distribution."""

    dist: str = "fixed"
    mean: float = 1.0
    sd: float = 0.0
    samples: tuple[float, ...] = ()

    def draw(self, rng: random.Random) -> float:
        """One duration from ``rng`` (never below :data:`MIN_DURATION`)."""
        if self.dist == "fixed":
            value = self.mean
        elif self.dist == "exponential":
            value = rng.expovariate(1.0 / self.mean)
        elif self.dist == "normal":
            value = rng.gauss(self.mean, self.sd)
        elif self.dist == "lognormal":
            # the parameters of the underlying normal from the distribution's own mean and sd
            sigma2 = math.log(1.0 + (self.sd / self.mean) ** 2)
            value = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        else:
            value = self.samples[rng.randrange(len(self.samples))]
        return max(MIN_DURATION, value)


@attrs.frozen
class FleetModel:
    """One model every replica can load: its slots, memory, load time, traffic and durations."""

    id: str
    slots: int = 1
    memory: int = 0
    load_time_s: float = 1.0
    rate: float = 0.0
    busy_timeout_ms: int = 0
    duration: Duration = Duration()


@attrs.frozen
class Phase:
    """From ``at`` on, these per-model arrival rates (models not named keep theirs)."""

    at: float
    rates: Mapping[str, float]


@attrs.frozen
class KillEvent:
    """Replica ``replica`` dies at ``at``."""

    at: float
    replica: int


@attrs.frozen
class ReplicaSettings:
    """What each replica is: its Ray cap and its runtime's settings."""

    count: int = 1
    max_ongoing_requests: int = 0  # 0: derived (see Workload.max_ongoing)
    start_time_s: float = 0.0
    graceful_shutdown_timeout_s: float = 20.0
    max_loaded_models: int = 0
    memory_budget: int = 0
    busy_timeout_ms: int = 0
    max_queue: int | None = None


@attrs.frozen
class RouterSettings:
    """The router's knobs (Ray Serve's defaults)."""

    max_queued_requests: int | None = None
    retries: int = 2
    multiplex_timeout_s: float = 1.0
    backoff_initial_s: float = 0.025
    backoff_multiplier: float = 2.0
    backoff_max_s: float = 0.5
    hop_s: float = 0.0


@attrs.frozen
class AutoscalingSettings:
    """Ray Serve's autoscaling config (its defaults, with a faster-to-read interval name)."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    interval_s: float = 0.1
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0


@attrs.frozen
class TraceArrival:
    """One arrival read from a trace file."""

    at: float
    model: str
    duration: float | None = None


@attrs.frozen
class Workload:
    """A parsed, validated workload."""

    name: str
    models: tuple[FleetModel, ...]
    replicas: ReplicaSettings
    description: str = ""
    seed: int = 0
    duration_s: float = 0.0
    requests: int = 0
    scheduling: str | None = None
    router: RouterSettings = RouterSettings()
    autoscaling: AutoscalingSettings | None = None
    phases: tuple[Phase, ...] = ()
    events: tuple[KillEvent, ...] = ()
    trace: tuple[TraceArrival, ...] | None = None

    @property
    def max_ongoing(self) -> int:
        """Ray's ``max_ongoing_requests`` per replica: as given, else as voxpool's Ray deployment
        derives it (docs/scale-out.md): every model's slots plus its queue bound (``max_queue``
        is per model; unbounded, as many again as its slots)."""
        if self.replicas.max_ongoing_requests:
            return self.replicas.max_ongoing_requests
        return ongoing_bounds([m.slots for m in self.models], self.replicas.max_queue)[0]

    def model(self, model_id: str) -> FleetModel:
        return next(m for m in self.models if m.id == model_id)

    def with_replicas(self, count: int) -> Workload:
        """The same workload on a fixed fleet of ``count`` replicas (no autoscaling)."""
        return attrs.evolve(
            self, replicas=attrs.evolve(self.replicas, count=count), autoscaling=None
        )


# ------------------------------------------------------------------ parsing
class _Table:
    """A TOML table read field by field, each error naming its path; unknown keys refused."""

    def __init__(self, raw: Any, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise WorkloadError(f"{path}: expected a table, got {type(raw).__name__}")
        self.raw = raw
        self.path = path
        self.used: set[str] = set()

    def _where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str) -> Any:
        self.used.add(key)
        return self.raw.get(key)

    def number(
        self, key: str, default: float, *, minimum: float = 0.0, strict: bool = False
    ) -> float:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WorkloadError(f"{self._where(key)}: expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            op = ">" if strict else ">="
            raise WorkloadError(f"{self._where(key)}: must be {op} {minimum:g}, got {value!r}")
        return value

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise WorkloadError(f"{self._where(key)}: expected an integer, got {value!r}")
        if value < minimum:
            raise WorkloadError(f"{self._where(key)}: must be >= {minimum}, got {value}")
        return value

    def string(self, key: str, default: str = "") -> str:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise WorkloadError(f"{self._where(key)}: expected a string, got {value!r}")
        return value

    def tables(self, key: str) -> list[Any]:
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise WorkloadError(f"{self._where(key)}: expected an array of tables ([[{key}]])")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            where = f"{self.path}: " if self.path else ""
            raise WorkloadError(f"{where}unknown key(s) {unknown}")


def _duration(raw: Any, path: str) -> Duration:
    if raw is None:
        return Duration()
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        if raw <= 0:
            raise WorkloadError(f"{path}: must be > 0, got {raw!r}")
        return Duration("fixed", float(raw))
    if isinstance(raw, list):
        return _samples(raw, path)
    t = _Table(raw, path)
    dist = t.string("dist", "fixed")
    if dist not in DISTRIBUTIONS:
        raise WorkloadError(f"{path}.dist: one of {list(DISTRIBUTIONS)}, got {dist!r}")
    if dist == "samples":
        out = _samples(t.get("values"), f"{path}.values")
        t.done()
        return out
    mean = t.number("mean", 1.0, minimum=0.0, strict=True)
    sd = t.number("sd", 0.0)
    if dist in ("normal", "lognormal") and t.get("sd") is None:
        raise WorkloadError(f"{path}.sd: required for dist = {dist!r}")
    t.done()
    return Duration(dist, mean, sd)


def _samples(raw: Any, path: str) -> Duration:
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{path}: expected a non-empty list of seconds")
    values = []
    for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise WorkloadError(f"{path}[{i}]: expected seconds > 0, got {v!r}")
        values.append(float(v))
    return Duration("samples", sum(values) / len(values), 0.0, tuple(values))


def _model(raw: Any, i: int) -> FleetModel:
    path = f"models[{i}]"
    t = _Table(raw, path)
    model_id = t.string("id")
    if not model_id:
        raise WorkloadError(f"{path}.id: required")
    slots = t.integer("slots", 1, minimum=1)
    if slots > 16:
        raise WorkloadError(f"{path}.slots: at most 16 (the runtime's limit), got {slots}")
    model = FleetModel(
        model_id,
        slots=slots,
        memory=t.integer("memory", 0),
        load_time_s=t.number("load_time_s", 1.0),
        rate=t.number("rate", 0.0),
        busy_timeout_ms=t.integer("busy_timeout_ms", 0),
        duration=_duration(t.get("duration"), f"{path}.duration"),
    )
    t.done()
    return model


def _replicas(raw: Any) -> ReplicaSettings:
    if raw is None:
        raise WorkloadError("replicas: required ([replicas] with count = N)")
    t = _Table(raw, "replicas")
    if t.get("count") is None:
        raise WorkloadError("replicas.count: required")
    max_queue = t.get("max_queue")
    if max_queue is not None:
        max_queue = t.integer("max_queue", 0)
    out = ReplicaSettings(
        count=t.integer("count", 1, minimum=0),
        max_ongoing_requests=t.integer("max_ongoing_requests", 0),
        start_time_s=t.number("start_time_s", 0.0),
        graceful_shutdown_timeout_s=t.number("graceful_shutdown_timeout_s", 20.0),
        max_loaded_models=t.integer("max_loaded_models", 0),
        memory_budget=t.integer("memory_budget", 0),
        busy_timeout_ms=t.integer("busy_timeout_ms", 0),
        max_queue=max_queue,
    )
    t.done()
    return out


def _router(raw: Any) -> RouterSettings:
    if raw is None:
        return RouterSettings()
    t = _Table(raw, "router")
    cap = t.get("max_queued_requests")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < -1):
        raise WorkloadError(f"router.max_queued_requests: -1 (no bound) or >= 0, got {cap!r}")
    out = RouterSettings(
        max_queued_requests=None if cap is None or cap == -1 else cap,
        retries=t.integer("retries", 2),
        multiplex_timeout_s=t.number("multiplex_timeout_s", 1.0),
        backoff_initial_s=t.number("backoff_initial_s", 0.025),
        backoff_multiplier=t.number("backoff_multiplier", 2.0, minimum=1.0),
        backoff_max_s=t.number("backoff_max_s", 0.5),
        hop_s=t.number("hop_s", 0.0),
    )
    t.done()
    return out


def _autoscaling(raw: Any, slots: int) -> AutoscalingSettings | None:
    if raw is None:
        return None
    t = _Table(raw, "autoscaling")
    out = AutoscalingSettings(
        min_replicas=t.integer("min_replicas", 1),
        max_replicas=t.integer("max_replicas", 1, minimum=1),
        target_ongoing_requests=t.number("target_ongoing_requests", float(slots), strict=True),
        upscale_delay_s=t.number("upscale_delay_s", 30.0),
        downscale_delay_s=t.number("downscale_delay_s", 600.0),
        look_back_period_s=t.number("look_back_period_s", 30.0, strict=True),
        interval_s=t.number("interval_s", 0.1, strict=True),
        upscaling_factor=t.number("upscaling_factor", 1.0, strict=True),
        downscaling_factor=t.number("downscaling_factor", 1.0, strict=True),
    )
    t.done()
    if out.min_replicas > out.max_replicas:
        raise WorkloadError(
            f"autoscaling: min_replicas {out.min_replicas} > max_replicas {out.max_replicas}"
        )
    return out


def _trace(raw: Any, base: Path | None, ids: Sequence[str]) -> tuple[TraceArrival, ...]:
    if not isinstance(raw, str) or not raw:
        raise WorkloadError(f"trace: expected a file name, got {raw!r}")
    path = Path(raw) if base is None else base / raw
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"trace: cannot read {raw}: {exc.strerror or exc}") from exc
    out: list[TraceArrival] = []
    last = 0.0
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) not in (2, 3):
            raise WorkloadError(f"trace {raw} line {n}: expected 'at,model[,duration]'")
        try:
            at = float(cells[0])
            duration = float(cells[2]) if len(cells) == 3 else None
        except ValueError as exc:
            raise WorkloadError(f"trace {raw} line {n}: {exc}") from exc
        if not math.isfinite(at) or at < last:
            raise WorkloadError(f"trace {raw} line {n}: times must be finite and non-decreasing")
        if cells[1] not in ids:
            raise WorkloadError(f"trace {raw} line {n}: unknown model {cells[1]!r}")
        if duration is not None and not duration > 0:
            raise WorkloadError(f"trace {raw} line {n}: duration must be > 0")
        last = at
        out.append(TraceArrival(at, cells[1], duration))
    return tuple(out)


def parse(raw: Mapping[str, Any], base: Path | None = None) -> Workload:
    """A validated :class:`Workload` from a TOML document (``base``: where a trace is read)."""
    t = _Table(raw, "")
    models = tuple(_model(m, i) for i, m in enumerate(t.tables("models")))
    if not models:
        raise WorkloadError("models: at least one [[models]] table is required")
    ids = [m.id for m in models]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise WorkloadError(f"models: duplicate id(s) {dupes}")
    scheduling = t.get("scheduling")
    if scheduling is not None and scheduling not in {s.value for s in Scheduling}:
        raise WorkloadError(
            f"scheduling: one of {[s.value for s in Scheduling]}, got {scheduling!r}"
        )
    phases = []
    for i, p in enumerate(t.tables("phases")):
        pt = _Table(p, f"phases[{i}]")
        at = pt.number("at", 0.0)
        rates_raw = pt.get("rates")
        rt = _Table(rates_raw if rates_raw is not None else {}, f"phases[{i}].rates")
        rates = {}
        for key in sorted(rt.raw):
            if key not in ids:
                raise WorkloadError(f"phases[{i}].rates: unknown model {key!r}")
            rates[key] = rt.number(key, 0.0)
        pt.done()
        phases.append(Phase(at, rates))
    if [p.at for p in phases] != sorted(p.at for p in phases):
        raise WorkloadError("phases: must be in time order")
    events = []
    for i, e in enumerate(t.tables("events")):
        et = _Table(e, f"events[{i}]")
        at = et.number("at", 0.0)
        if et.get("kill") is None:
            raise WorkloadError(f"events[{i}]: the only event is kill = REPLICA")
        events.append(KillEvent(at, et.integer("kill", 0)))
        et.done()
    replicas = _replicas(t.get("replicas"))
    target = ongoing_bounds([m.slots for m in models], None)[1]
    autoscaling = _autoscaling(t.get("autoscaling"), target)
    trace_raw = t.get("trace")
    trace = None if trace_raw is None else _trace(trace_raw, base, ids)
    duration_s = t.number("duration_s", 0.0)
    if trace is None and duration_s <= 0:
        raise WorkloadError("duration_s: required (> 0) unless a trace gives the arrivals")
    if trace is None and not any(m.rate > 0 for m in models) and not phases:
        raise WorkloadError("models: no model has a rate > 0 (and no phase sets one)")
    seed = t.integer("seed", 0)
    workload = Workload(
        name=t.string("name", "fleet workload"),
        description=t.string("description"),
        seed=seed,
        duration_s=duration_s,
        requests=t.integer("requests", 0),
        scheduling=scheduling,
        models=models,
        replicas=replicas,
        router=_router(t.get("router")),
        autoscaling=autoscaling,
        phases=tuple(phases),
        events=tuple(sorted(events, key=lambda e: (e.at, e.replica))),
        trace=trace,
    )
    t.done()
    if replicas.count == 0 and autoscaling is None:
        raise WorkloadError("replicas.count: 0 replicas and no [autoscaling]: nothing would serve")
    if workload.max_ongoing < 1:
        raise WorkloadError("replicas.max_ongoing_requests: must be >= 1")
    return workload


def load(path: str | Path) -> Workload:
    """Read and validate a workload file (:class:`WorkloadError` names what is wrong)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkloadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"{path}: not valid TOML: {exc}") from exc
    return parse(raw, path.parent)


def scheduling_for(workload: Workload, seed: int) -> Scheduling:
    """The scheduling mode of a run: the workload's, else the seed's (as for scenarios)."""
    if workload.scheduling:
        return Scheduling(workload.scheduling)
    return Scheduling.for_seed(seed)
