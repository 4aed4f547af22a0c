"""Draw a run as a timeline: one lane per slot per model, bars coloured by outcome.

Everything comes from the run's trace, so a trace is enough to draw (the
runner's outcomes only name the scenario). Who held which slot is read from
core's decisions, read from each record's typed ``fields`` (never its summary
text): a request record is ``granted`` with its slot at once, or ``queued``,
and a later release / expire / cancel record grants it among its wake-ups
(``granted``: ``[ticket, slot]`` pairs). A client action owns the ticket created in the
same trio step as its ``action`` record, which is the very next record (the
runtime asks core for a ticket before its first checkpoint), or the ticket of
the ``register`` / ``bulk_publish`` record that follows instead.

Lanes per model, top to bottom: ``mgmt`` (management barriers as wide spans;
weight loads and teardowns as thin bars inside), ``slot 0..n-1`` (requests,
streams and batches from grant to release, with a thin line for their time in
the queue) and ``rejected`` (requests that never got a slot: rejected at once,
expired, or cancelled while queued). A second panel plots each model's queue
depth (requests and managers waiting) over virtual time.

The figure is built on :class:`matplotlib.figure.Figure` directly, rendered by
the Agg canvas (PNG) or the SVG one; pyplot and its global backend are never
touched. Every bar carries an SVG id (``bar-<kind>-<n>``) so tests and tools can
count them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from core.events import TraceRecord
from sim.runner import RunResult

REQUEST_ACTIONS = frozenset({"request", "stream", "batch"})
MANAGEMENT_ACTIONS = frozenset(
    {"load", "unload", "reconfigure", "register", "bulk_unload", "shutdown"}
)

OUTCOME_COLOURS = {
    "ok": "#43a047",
    "busy": "#fb8c00",
    "error": "#e53935",
    "cancelled": "#9e9e9e",
}
"""Bar colours; not_found and invalid draw as errors, an unfinished action as pending."""
PENDING_COLOUR = "#d0d0d0"
BARRIER_COLOUR = "#bbdefb"
LOAD_COLOUR = "#1565c0"
TEARDOWN_COLOUR = "#6d4c41"
QUEUE_COLOURS = (
    "#1e88e5",
    "#8e24aa",
    "#00897b",
    "#f4511e",
    "#6d4c41",
    "#c0ca33",
    "#3949ab",
    "#d81b60",
)


@attrs.define
class _Ticket:
    ticket: int
    model: str
    kind: str  # request | manage | bulk | register | evict | retire
    arrived: float
    action: str | None = None
    granted: float | None = None
    slot: int | None = None
    ended: float | None = None


@attrs.frozen
class Bar:
    """One rectangle: ``kind`` is request, wait, barrier, load or teardown."""

    kind: str
    lane: tuple[str, str]
    start: float
    end: float
    colour: str
    label: str = ""
    action: str | None = None


@attrs.frozen
class Timeline:
    """What :func:`draw` draws: lanes (model, name) top to bottom, bars, queue depth steps."""

    title: str
    lanes: tuple[tuple[str, str], ...]
    bars: tuple[Bar, ...]
    queue: dict[str, tuple[tuple[float, int], ...]]
    end: float

    def count(self, kind: str) -> int:
        return sum(1 for b in self.bars if b.kind == kind)


def outcome_colour(outcome: str) -> str:
    if outcome in ("not_found", "invalid"):
        return OUTCOME_COLOURS["error"]
    return OUTCOME_COLOURS.get(outcome, PENDING_COLOUR)


class _Reader:
    """Walks a trace once and collects tickets, lifecycle spans, actions and queue depth."""

    def __init__(self) -> None:
        self.tickets: dict[int, _Ticket] = {}
        self.actions: dict[str, dict[str, object]] = {}
        self.models: list[str] = []
        self.slots: dict[str, int] = {}
        self.spans: list[tuple[str, str, float, float]] = []  # (model, load|teardown, start, end)
        self._open: dict[tuple[str, str], float] = {}
        self.queued: dict[str, set[int]] = {}
        self.queue: dict[str, list[tuple[float, int]]] = {}
        self._armed: str | None = None
        self._armed_at = 0.0
        self.end = 0.0

    def model(self, model: str) -> None:
        if model and model not in self.models:
            self.models.append(model)
            self.slots.setdefault(model, 1)
            self.queued[model] = set()
            self.queue[model] = [(0.0, 0)]

    def ticket(self, ticket: int, model: str, kind: str, t: float) -> _Ticket:
        info = self.tickets.get(ticket)
        if info is None:
            self.model(model)
            info = _Ticket(ticket, model, kind, t)
            self.tickets[ticket] = info
        return info

    def own(self, info: _Ticket) -> None:
        if self._armed is not None:
            info.action = self._armed

    def grant(self, info: _Ticket, t: float, slot: int | None) -> None:
        info.granted = t
        info.slot = slot
        if info.slot is not None:
            self.slots[info.model] = max(self.slots.get(info.model, 1), info.slot + 1)
        self.unqueue(info, t)

    def unqueue(self, info: _Ticket, t: float) -> None:
        waiting = self.queued.get(info.model)
        if waiting is not None and info.ticket in waiting:
            waiting.discard(info.ticket)
            self.depth(info.model, t)

    def enqueue(self, info: _Ticket, t: float) -> None:
        self.queued[info.model].add(info.ticket)
        self.depth(info.model, t)

    def depth(self, model: str, t: float) -> None:
        series = self.queue[model]
        n = len(self.queued[model])
        if series[-1][0] == t:
            series[-1] = (t, n)
        else:
            series.append((t, n))

    def wakeups(self, fields: Mapping[str, Any], t: float) -> None:
        for ticket, slot in fields.get("granted", ()):
            info = self.tickets.get(int(ticket))
            if info is not None:
                self.grant(info, t, slot)
        for ticket in fields.get("expired", ()):
            info = self.tickets.get(int(ticket))
            if info is not None:
                info.ended = t
                self.unqueue(info, t)

    def open_span(self, model: str, what: str, t: float) -> None:
        self._open.setdefault((model, what), t)

    def close_span(self, model: str, what: str, t: float) -> None:
        start = self._open.pop((model, what), None)
        if start is not None:
            self.spans.append((model, what, start, t))

    def evictions(self, victims: Iterable[tuple[str, int]], t: float, kind: str) -> None:
        for model, ticket in victims:
            info = self.ticket(int(ticket), model, kind, t)
            self.grant(info, t, None)
            self.open_span(model, "teardown", t)

    def admission(self, rec: TraceRecord, kind: str) -> None:
        info = self.ticket(int(rec.args["ticket"]), rec.model, kind, rec.t)
        self.own(info)
        outcome = rec.fields.get("outcome")
        if outcome == "granted":
            self.grant(info, rec.t, rec.fields["slot"])
        elif outcome == "queued":
            self.enqueue(info, rec.t)
        else:
            info.ended = rec.t

    def read(self, rec: TraceRecord) -> None:
        """Take one record; the ``action`` record arms ownership for the core call after it."""
        self.end = max(self.end, rec.t)
        ev, d = rec.event, rec.decision
        if rec.t != self._armed_at:
            self._armed = None  # ownership never outlives the trio step (same virtual instant)
        if ev == "action":
            self.model(rec.model)
            self.actions[str(rec.args["id"])] = {
                "do": rec.args.get("do"),
                "model": rec.model,
                "start": rec.t,
                "outcome": "pending",
            }
            self._armed, self._armed_at = str(rec.args["id"]), rec.t
            return
        if ev == "action_end":
            act = self.actions.get(str(rec.args["id"]))
            if act is not None:
                act["end"], act["outcome"] = rec.t, d
            self._armed = None
            return
        if ev in ("new_ticket", "stop_admitting"):
            # the call that uses the ticket (a shutdown's bulk_publish) follows in the same step
            return
        if ev == "register" and rec.fields.get("outcome") != "registered":
            self.model(rec.model)
            return  # an existing id: the reconfigure's own new_ticket follows
        self.core_call(rec)
        self._armed = None

    def core_call(self, rec: TraceRecord) -> None:
        ev, t, f = rec.event, rec.t, rec.fields
        if ev == "register":
            self.model(rec.model)
            self.slots[rec.model] = max(self.slots[rec.model], int(rec.args.get("slots", 1)))
            info = self.ticket(int(f["ticket"]), rec.model, "register", t)
            self.own(info)
            self.grant(info, t, None)
        elif ev in ("request", "manage", "try_acquire"):
            self.admission(rec, "request" if ev == "request" else "manage")
        elif ev == "bulk_publish":
            for model, ticket in f.get("tickets", {}).items():
                info = self.ticket(int(ticket), model, "bulk", t)
                self.own(info)
                if model in f.get("ready", ()):
                    self.grant(info, t, None)
                else:
                    self.enqueue(info, t)
        elif ev in ("release", "cancel"):
            held = self.tickets.get(int(rec.args["ticket"]))
            if held is not None:
                held.ended = t
                self.unqueue(held, t)
            self.wakeups(f, t)
        elif ev == "expire":
            self.wakeups(f, t)
        elif ev in ("ensure_loaded", "begin_load"):
            self.evictions(f.get("evict", ()), t, "evict")
            if f.get("load") is not None:
                self.open_span(rec.model, "load", t)
        elif ev in ("load_succeeded", "load_failed"):
            self.close_span(rec.model, "load", t)
        elif ev in ("begin_unload", "commit_reconfigure"):
            if f.get("teardown") is not None:
                self.open_span(rec.model, "teardown", t)
            if ev == "commit_reconfigure":
                self.slots[rec.model] = max(self.slots[rec.model], int(rec.args.get("slots", 1)))
        elif ev == "unload_finished":
            self.close_span(rec.model, "teardown", t)
        elif ev == "retire_idle":
            self.evictions(f.get("evict", ()), t, "retire")


def build(result: RunResult) -> Timeline:
    """The timeline of ``result`` (see the module docstring for what goes where)."""
    return build_from_trace(
        result.trace, f"{result.scenario} (seed {result.seed})", result.end_time
    )


def build_from_trace(trace: Iterable[TraceRecord], title: str = "", end: float = 0.0) -> Timeline:
    """The timeline of a trace (a recorded run, or a production server's trace file)."""
    r = _Reader()
    for rec in trace:
        r.read(rec)
    end = max(end, r.end)
    by_action: dict[str, list[_Ticket]] = {}
    for info in r.tickets.values():
        if info.action is not None:
            by_action.setdefault(info.action, []).append(info)
    bars: list[Bar] = []
    rejected_lane: set[str] = set()
    for action_id, act in r.actions.items():
        do, model, start = str(act["do"]), str(act["model"]), float(act["start"])  # type: ignore[arg-type]
        stop = float(act.get("end", end))  # type: ignore[arg-type]
        outcome = str(act["outcome"])
        colour = outcome_colour(outcome)
        owned = by_action.get(action_id, [])
        if do in REQUEST_ACTIONS:
            held = next((i for i in owned if i.slot is not None and i.granted is not None), None)
            if held is None:
                rejected_lane.add(model)
                bars.append(
                    Bar("request", (model, "rejected"), start, stop, colour, action_id, action_id)
                )
                continue
            lane = (held.model, f"slot {held.slot}")
            assert held.granted is not None
            if held.granted > held.arrived:
                bars.append(Bar("wait", lane, held.arrived, held.granted, colour, "", action_id))
            released = held.ended if held.ended is not None else stop
            bars.append(Bar("request", lane, held.granted, released, colour, action_id, action_id))
        elif do in MANAGEMENT_ACTIONS:
            for info in owned:
                lane = (info.model, "mgmt")
                if info.granted is None:
                    stop_at = info.ended if info.ended is not None else stop
                    bars.append(
                        Bar(
                            "barrier",
                            lane,
                            info.arrived,
                            stop_at,
                            colour,
                            f"{action_id} ({outcome})",
                            action_id,
                        )
                    )
                    continue
                if info.granted > info.arrived:
                    bars.append(
                        Bar("wait", lane, info.arrived, info.granted, colour, action_id, action_id)
                    )
                released = info.ended if info.ended is not None else stop
                bars.append(
                    Bar("barrier", lane, info.granted, released, colour, action_id, action_id)
                )
    for info in r.tickets.values():
        unowned = info.action is None and info.kind != "request"
        if (
            unowned
            and info.granted is not None
            and info.ended is not None
            and info.ended > info.granted
        ):
            label = {"manage": "load", "bulk": "shutdown"}.get(info.kind, info.kind)
            bars.append(
                Bar(
                    "barrier", (info.model, "mgmt"), info.granted, info.ended, BARRIER_COLOUR, label
                )
            )
    for model, what, s, e in r.spans:
        bars.append(
            Bar(
                what,
                (model, "mgmt"),
                s,
                e,
                LOAD_COLOUR if what == "load" else TEARDOWN_COLOUR,
                what,
            )
        )
    lanes: list[tuple[str, str]] = []
    for model in r.models:
        lanes.append((model, "mgmt"))
        lanes += [(model, f"slot {i}") for i in range(r.slots.get(model, 1))]
        if model in rejected_lane:
            lanes.append((model, "rejected"))
    queue = {m: (*r.queue[m], (end, len(r.queued[m]))) for m in r.models}
    return Timeline(title, tuple(lanes), tuple(bars), queue, end)


SUFFIXES = (".svg", ".png")
"""The picture formats :func:`render` writes, chosen by the path's suffix."""


def draw(result: RunResult, path: str) -> None:
    """Write ``result``'s timeline to ``path`` (.svg or .png, chosen by the extension)."""
    render(build(result), path)


def render(tl: Timeline, path: str) -> None:
    """Write a built timeline to ``path`` (.svg or .png)."""
    import matplotlib as mpl
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"timeline path must end in {' or '.join(SUFFIXES)}, not {path!r}")
    rows = {lane: i for i, lane in enumerate(tl.lanes)}
    span = max(tl.end, 1e-3)
    min_width = span / 400.0
    lanes_h, queue_h = 0.3 * max(len(tl.lanes), 1), 1.3
    with mpl.rc_context(
        {"svg.hashsalt": "voxpool-timeline", "svg.fonttype": "none", "font.size": 8}
    ):
        fig = Figure(figsize=(12, 1.2 + lanes_h + queue_h), layout="constrained")
        ax, qax = fig.subplots(2, 1, sharex=True, height_ratios=(lanes_h, queue_h))
        counters: dict[str, int] = {}

        def rect(bar: Bar, y: float, h: float, **style: object) -> None:
            n = counters[bar.kind] = counters.get(bar.kind, 0) + 1
            width = max(bar.end - bar.start, min_width)
            patch = Rectangle((bar.start, y - h / 2), width, h, **style)  # type: ignore[arg-type]
            patch.set_gid(f"bar-{bar.kind}-{n}")
            ax.add_patch(patch)

        for bar in tl.bars:
            y = rows[bar.lane]
            if bar.kind == "request":
                rect(bar, y, 0.7, facecolor=bar.colour, edgecolor="black", linewidth=0.4)
            elif bar.kind == "wait":
                rect(bar, y, 0.12, facecolor=bar.colour, edgecolor="none", alpha=0.6, zorder=0.9)
            elif bar.kind == "barrier":
                edge = bar.colour if bar.colour != BARRIER_COLOUR else "#607d8b"
                rect(
                    bar, y, 0.8, facecolor=BARRIER_COLOUR, edgecolor=edge, linewidth=1.0, hatch="//"
                )
            else:
                rect(bar, y + 0.22, 0.25, facecolor=bar.colour, edgecolor="none")
            if not bar.label or bar.kind in ("load", "teardown"):
                continue
            if bar.end - bar.start > span / 40 or bar.lane[1] == "rejected":
                left = bar.start + (
                    span / 400 if bar.end - bar.start > span / 40 else min_width * 1.5
                )
                ax.text(
                    left,
                    y - (0.12 if bar.kind == "barrier" else 0.0),
                    bar.label,
                    va="center",
                    ha="left",
                    fontsize=6.5,
                    clip_on=True,
                )
            elif bar.kind == "wait" or bar.lane[1] == "mgmt":
                ax.text(
                    bar.start,
                    y - 0.3,
                    bar.label,
                    va="bottom",
                    ha="left",
                    fontsize=6,
                    color="#424242",
                    clip_on=True,
                )
        ax.set_ylim(len(tl.lanes) - 0.5, -0.5)
        ax.set_yticks(range(len(tl.lanes)), [f"{m}  {name}" for m, name in tl.lanes])
        for i in range(1, len(tl.lanes)):
            if tl.lanes[i][0] != tl.lanes[i - 1][0]:
                ax.axhline(i - 0.5, color="#9e9e9e", linewidth=0.6)
        ax.grid(axis="x", color="#eeeeee", linewidth=0.5)
        ax.set_axisbelow(True)
        ax.set_title(tl.title)
        handles: list[Artist] = [
            Patch(facecolor=c, edgecolor="black", linewidth=0.4, label=f"request: {o}")
            for o, c in OUTCOME_COLOURS.items()
        ]
        handles += [
            Patch(
                facecolor=BARRIER_COLOUR,
                edgecolor="#607d8b",
                hatch="//",
                label="management barrier",
            ),
            Patch(facecolor=LOAD_COLOUR, label="weight load"),
            Patch(facecolor=TEARDOWN_COLOUR, label="teardown"),
            Line2D(
                [], [], color="#757575", linewidth=2, label="time queued (thin, outcome colour)"
            ),
        ]
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            fontsize=7,
            frameon=False,
        )
        for i, (model, steps) in enumerate(tl.queue.items()):
            xs, ys = _steps(steps)
            qax.step(
                xs,
                ys,
                where="post",
                color=QUEUE_COLOURS[i % len(QUEUE_COLOURS)],
                label=model,
                linewidth=1.2,
            )
        qax.set_ylabel("queued")
        qax.set_xlabel("virtual time (s)")
        qax.yaxis.get_major_locator().set_params(integer=True)
        qax.set_xlim(0.0, span * 1.01)
        qax.legend(
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            fontsize=7,
            frameon=False,
            title="queue depth",
        )
        qax.grid(color="#eeeeee", linewidth=0.5)
        metadata = {"Date": None} if suffix == ".svg" else None
        fig.savefig(path, metadata=metadata, dpi=110)


def _steps(points: Sequence[tuple[float, int]]) -> tuple[list[float], list[int]]:
    xs = [t for t, _ in points if math.isfinite(t)]
    ys = [n for t, n in points if math.isfinite(t)]
    return xs, ys
