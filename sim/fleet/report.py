"""The fleet's answers as text (tables) and as a picture (matplotlib, imported lazily).

Everything here is a function of the summaries alone (virtual time, counts), so
the same workload and seed print the same bytes in any process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from sim.fleet.stats import BACKPRESSURE, BUSY, ERROR, FAILED, OK, FleetSummary, Latencies


@attrs.frozen
class Goal:
    """What a sweep looks for: p99 at most ``p99`` seconds, 503 rate at most ``busy_rate``."""

    p99: float | None = None
    busy_rate: float | None = None

    def met(self, s: FleetSummary) -> bool:
        """Whether ``s`` meets the goal (a run with no successful request never does)."""
        if s.latency.count == 0:
            return False
        if self.p99 is not None and not s.latency.p99 <= self.p99:
            return False
        return self.busy_rate is None or s.busy_rate <= self.busy_rate


def _s(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _t(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned columns (the first row is the header), right-aligned but for the first column."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=False)
        ]
        out.append("  ".join(cells).rstrip())
    return out


def _lat(lat: Latencies) -> list[str]:
    return [_s(lat.p50), _s(lat.p95), _s(lat.p99)]


def overall_row(s: FleetSummary) -> list[str]:
    c = s.counts
    return [
        str(s.replicas),
        str(s.requests),
        str(c[OK]),
        *_lat(s.latency),
        f"{s.busy_rate:.4f}",
        str(c[BUSY]),
        str(c[BACKPRESSURE]),
        str(c[FAILED] + c[ERROR]),
        str(s.peak_replicas),
    ]


OVERALL = [
    "replicas",
    "requests",
    "ok",
    "p50_s",
    "p95_s",
    "p99_s",
    "busy_rate",
    "503_busy",
    "503_queue",
    "failed",
    "peak",
]
"""The columns of a run's overall row: 503_busy are replicas' busy answers after the ingress's
retries, 503_queue the router's back-pressure refusals, failed the requests whose replica died
(or whose load failed), peak the most replicas running at once."""


REPLICA_COLUMNS = (
    "replica up_s down_s sent served p50_s p95_s p99_s 503s busy_rate failed loads".split()  # noqa: SIM905
)
"""The columns of a replica's row: sent counts each request the router sent it (a retried
request on each replica it tried), 503s the busy answers it gave, busy_rate their share."""


def summary_lines(name: str, seed: int, s: FleetSummary) -> list[str]:
    """The report of one run: the overall row, then one row per replica."""
    lines = [f"fleet: {name} (seed {seed})", ""]
    lines += table([OVERALL, overall_row(s)])
    lines.append("")
    models = [["model", "requests", "ok", "p50_s", "p95_s", "p99_s", "503s", "busy_rate"]]
    for m in s.per_model:
        models.append(
            [m.model, str(m.requests), str(m.latency.count), *_lat(m.latency), str(m.busy),
             f"{m.busy_rate:.4f}"]
        )  # fmt: skip
    lines += table(models)
    lines.append("")
    rows = [REPLICA_COLUMNS]
    for r in s.per_replica:
        rows.append(
            [
                str(r.rid),
                _t(r.started_at),
                _t(r.stopped_at),
                str(r.sent),
                str(r.latency.count),
                *_lat(r.latency),
                str(r.busy_answers),
                f"{r.busy_rate:.4f}",
                str(r.failed),
                str(r.loads),
            ]
        )
    lines += table(rows)
    lines.append("")
    lines.append(f"virtual time {s.end_time:.3f} s")
    lines += [f"warning: {w}" for w in s.warnings]
    lines += violation_lines(s)
    return lines


def violation_lines(s: FleetSummary) -> list[str]:
    if not s.violations:
        return ["invariants hold in every replica"]
    out = [f"FAILED: {len(s.violations)} invariant violation(s)"]
    out += [f"  - {v}" for v in s.violations[:50]]
    return out


def sweep_lines(name: str, seed: int, runs: Sequence[FleetSummary], goal: Goal) -> list[str]:
    """The report of a sweep: one row per replica count, then the answer."""
    lines = [f"fleet sweep: {name} (seed {seed})", ""]
    rows = [[*overall_row(s), "yes" if goal.met(s) else "no"] for s in runs]
    lines += table([[*OVERALL, "meets"], *rows])
    lines.append("")
    wanted = []
    if goal.p99 is not None:
        wanted.append(f"p99 <= {goal.p99:g} s")
    if goal.busy_rate is not None:
        wanted.append(f"503 rate <= {goal.busy_rate:g}")
    best = smallest_meeting(runs, goal)
    what = " and ".join(wanted) or "(no goal given: every run meets it)"
    if best is None:
        lines.append(f"no replica count in the sweep meets {what}")
    else:
        lines.append(f"smallest replica count meeting {what}: {best.replicas}")
    bad = [s for s in runs if s.violations]
    for s in bad:
        lines.append(f"replicas={s.replicas}:")
        lines += ["  " + v for v in violation_lines(s)]
    if not bad:
        lines.append("invariants hold in every replica of every run")
    return lines


def smallest_meeting(runs: Sequence[FleetSummary], goal: Goal) -> FleetSummary | None:
    """The run with the fewest replicas that meets ``goal`` (None: none does)."""
    meeting = [s for s in runs if goal.met(s)]
    return min(meeting, key=lambda s: s.replicas, default=None)


# ------------------------------------------------------------------ picture
def draw(
    path: str | Path,
    models: Sequence[str],
    detail: FleetSummary,
    sweep: Sequence[FleetSummary] = (),
) -> None:
    """A PNG (or SVG, by extension): latency percentiles and busy rate against replicas (for a
    sweep; else running replicas over time), and every replica's residency over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = len(detail.residency)
    height = 3.0 + min(12.0, 0.12 * lanes * max(1, len(models)) ** 0.5 + 1.0)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 3.0 + height), gridspec_kw={"height_ratios": [3.0, height]}
    )
    if sweep:
        xs = [s.replicas for s in sweep]
        for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            top.plot(xs, [getattr(s.latency, q) for s in sweep], style, marker="o", label=q)
        top.set_xlabel("replicas")
        top.set_xticks(xs)
        top.set_ylabel("latency (s)")
        top.set_yscale("log")
        twin = top.twinx()
        twin.plot(xs, [s.busy_rate for s in sweep], color="tab:red", marker="s", label="503 rate")
        twin.set_ylabel("503 rate")
        lines, labels = top.get_legend_handles_labels()
        more, more_labels = twin.get_legend_handles_labels()
        top.legend(lines + more, labels + more_labels, loc="upper right", fontsize=8)
        top.set_title("latency percentiles and 503 rate against replicas")
    else:
        times = [t for t, _ in detail.scale] + [detail.end_time]
        counts = [n for _, n in detail.scale]
        if counts:
            top.step([*times[:-1], times[-1]], [*counts, counts[-1]], where="post")
        top.set_xlabel("virtual time (s)")
        top.set_ylabel("running replicas")
        top.set_title(
            f"{detail.requests} requests: p50 {_s(detail.latency.p50)} s, p99 "
            f"{_s(detail.latency.p99)} s, 503 rate {detail.busy_rate:.4f}"
        )
    _residency(bottom, models, detail)
    fig.tight_layout()
    fig.savefig(str(path), metadata=_metadata(str(path)))
    plt.close(fig)


def _metadata(path: str) -> dict[str, str | None]:
    """No software version or date in the file: the same run draws the same bytes."""
    if path.endswith(".svg"):
        return {"Date": None, "Creator": None}
    return {"Software": None}


def _residency(axes: Any, models: Sequence[str], s: FleetSummary) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    cmap = plt.get_cmap("tab20")
    colours = {m: cmap(i % 20) for i, m in enumerate(models)}
    band = 0.8 / max(1, len(models))
    for rid, timeline in sorted(s.residency.items()):
        if not timeline:
            continue
        for (t0, loaded), (t1, _) in zip(timeline, [*timeline[1:], (s.end_time, ())], strict=False):
            for m in loaded:
                k = models.index(m)
                axes.broken_barh(
                    [(t0, max(t1 - t0, 0.0))],
                    (rid - 0.4 + k * band, band),
                    facecolors=colours[m],
                )
    handles = [Rectangle((0, 0), 1, 1, color=colours[m]) for m in models[:20]]
    axes.legend(handles, list(models[:20]), loc="upper right", fontsize=6, ncol=5)
    axes.set_xlabel("virtual time (s)")
    rids = sorted(s.residency)
    if len(rids) <= 40:
        axes.set_yticks(rids)
    axes.set_ylabel("replica")
    axes.set_title("models loaded per replica over time")
    axes.set_xlim(0, max(s.end_time, 1e-9))
