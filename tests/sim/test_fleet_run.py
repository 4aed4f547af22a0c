"""Fleet runs: real runtimes behind the router model, under one virtual clock."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from server.cli import main as cli_main
from server.runtime import Runtime
from sim import cmd_fleet
from sim.fleet import report
from sim.fleet.run import run_fleet
from sim.fleet.stats import BACKPRESSURE, BUSY, FAILED, OK, FleetSummary
from sim.fleet.workload import Workload, load, parse
from tests.mutants.catalogue import activate

ROOT = Path(__file__).resolve().parents[2]

SMALL = """
name = "small"
description = "a small fleet for the command's tests"
seed = 2
duration_s = 40.0
[replicas]
count = 2
max_ongoing_requests = 3
max_loaded_models = 1
max_queue = 1
[[models]]
id = "a"
slots = 2
load_time_s = 0.5
rate = 3.0
duration = { dist = "normal", mean = 0.5, sd = 0.1 }
[[models]]
id = "b"
slots = 1
load_time_s = 0.2
rate = 1.0
duration = [0.2, 0.3]
"""


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def workload(text: str, tmp_path: Path | None = None, trace: str | None = None) -> Workload:
    if trace is not None:
        assert tmp_path is not None
        (tmp_path / "trace.csv").write_text(trace)
        text = 'trace = "trace.csv"\n' + text
    return parse(tomllib.loads(text), tmp_path)


def lines(s: FleetSummary) -> str:
    return "\n".join(report.summary_lines("t", 0, s))


ONE_MODEL = """
duration_s = 60.0
[replicas]
count = 4
max_ongoing_requests = 2
[[models]]
id = "a"
slots = 2
load_time_s = 1.0
rate = 0.5
duration = 0.5
"""


def test_same_seed_same_report_other_seed_other_report() -> None:
    w = workload(ONE_MODEL.replace("rate = 0.5", "rate = 6.0"))
    a, b, c = run_fleet(w, 1), run_fleet(w, 1), run_fleet(w, 2)
    assert lines(a) == lines(b)
    assert lines(a) != lines(c)
    assert not a.violations


def test_same_bytes_in_other_processes(small: Path) -> None:
    outs = []
    for hashseed in ("0", "123"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        done = subprocess.run(
            [sys.executable, "-m", "server.cli", "sim", "fleet", str(small), "--seed", "4"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        outs.append(done.stdout)
    here = "\n".join(report.summary_lines("small", 4, run_fleet(load(small), 4))) + "\n"
    assert outs[0] == outs[1] == here.encode()


def test_light_traffic_stays_on_the_replica_that_has_the_model() -> None:
    # instant loads: no second request can arrive while the first replica is still loading
    # (a replica reports a model only once it is loaded, as Ray's replicas do)
    text = ONE_MODEL.replace("load_time_s = 1.0", "load_time_s = 0.0")
    s = run_fleet(workload(text.replace("max_ongoing_requests = 2", "max_ongoing_requests = 8")), 3)
    assert s.counts[OK] == s.requests > 10
    assert sum(r.loads for r in s.per_replica) == 1  # one load in the whole fleet
    served = [r.latency.count for r in s.per_replica]
    assert sorted(served) == [0, 0, 0, s.requests]


def test_router_back_pressure_is_a_503_and_counted(tmp_path: Path) -> None:
    text = ONE_MODEL.replace("count = 4", "count = 1").replace(
        "max_ongoing_requests = 2", "max_ongoing_requests = 1"
    )
    text += "[router]\nmax_queued_requests = 1\n"
    # three at once: one runs, one waits at the router, the third is refused
    s = run_fleet(workload(text, tmp_path, "0.0,a,1.0\n0.0,a,1.0\n0.0,a,1.0\n"), 0)
    assert s.counts[OK] == 2 and s.counts[BACKPRESSURE] == 1
    assert s.busy_rate == pytest.approx(1 / 3)
    # the queued one waited for the first (1 s load + 1 s run) plus at most one backoff step
    assert 3.0 <= s.latency.p99 <= 3.5


def test_a_replicas_busy_answer_is_retried_on_another_then_counted(tmp_path: Path) -> None:
    text = """
[replicas]
count = 2
max_ongoing_requests = 5
max_queue = 0
[router]
retries = 1
[[models]]
id = "a"
slots = 1
load_time_s = 0.0
duration = 1.0
"""
    # the first request loads the model on one replica; the second goes there too (affinity),
    # is refused busy (one slot, no queue) and is retried on the other replica, which loads
    # it; the third is refused by both: a 503 to the client
    s = run_fleet(workload(text, tmp_path, "0.0,a\n0.1,a\n0.2,a\n"), 0)
    assert s.counts[OK] == 2 and s.counts[BUSY] == 1
    assert sorted(r.busy_answers for r in s.per_replica) == [1, 2]
    assert sorted(r.loads for r in s.per_replica) == [1, 1]
    retried = run_fleet(workload(text, tmp_path, "0.0,a\n0.1,a\n0.5,a,0.2\n0.95,a\n"), 0)
    assert retried.counts[BUSY] + retried.counts[OK] == 4


def test_a_replica_dying_loses_its_in_flight_requests_which_are_retried_or_fail(
    tmp_path: Path,
) -> None:
    text = """
[replicas]
count = 2
max_ongoing_requests = 2
start_time_s = 2.0
[router]
retries = RETRIES
[[models]]
id = "a"
slots = 2
load_time_s = 0.0
duration = 10.0
[[events]]
at = 1.0
kill = 0
"""
    trace = "".join(f"{0.01 * i:.2f},a\n" for i in range(4)) + "20.0,a,1.0\n20.0,a,1.0\n"
    # no retries: what ran on the dead replica fails at the instant it died
    s = run_fleet(workload(text.replace("RETRIES", "0"), tmp_path, trace), 0)
    dead = s.per_replica[0]
    assert dead.stopped_at == 1.0 and dead.failed == s.counts[FAILED] >= 1
    assert s.counts[OK] + s.counts[FAILED] == 6
    assert len(s.per_replica) == 3 and s.per_replica[2].started_at == pytest.approx(3.0)
    assert s.per_replica[0].latency.count == 0
    assert not s.violations
    # with a retry (voxpool's ingress retries a lost replica): the same requests are served
    retried = run_fleet(workload(text.replace("RETRIES", "1"), tmp_path, trace), 0)
    assert retried.per_replica[0].failed == dead.failed
    assert (retried.counts[OK], retried.counts[FAILED]) == (6, 0)
    s = retried
    assert not s.violations  # the dead replica's runtime still drained and shut down cleanly


def test_the_autoscaler_scales_up_under_load_and_down_after_its_delay() -> None:
    text = """
duration_s = 120.0
[replicas]
count = 1
max_ongoing_requests = 4
start_time_s = 2.0
[autoscaling]
min_replicas = 1
max_replicas = 6
target_ongoing_requests = 1.0
upscale_delay_s = 2.0
downscale_delay_s = 20.0
look_back_period_s = 2.0
interval_s = 0.5
[[models]]
id = "a"
slots = 2
load_time_s = 0.5
rate = 8.0
duration = 0.5
[[phases]]
at = 30.0
rates = { a = 0.2 }
"""
    s = run_fleet(workload(text), 0)
    assert s.peak_replicas >= 3
    ups = [t for t, n in s.scale if n > 1]
    assert ups and min(ups) < 10.0  # up within the burst
    final = s.scale[-1][1] if s.scale[-1][0] < s.end_time - 1 else s.scale[-2][1]
    assert final < s.peak_replicas
    changes = list(zip(s.scale[1:], s.scale, strict=False))
    first_down = min(t for (t, n), (_, before) in changes if n < before)
    last_up = max(t for (t, n), (_, before) in changes if n > before and t < first_down)
    # after the last upscale (a replica runs start_time_s after the decision, which reset the
    # decision counter) the downscale decision needs downscale_delay_s of consecutive ticks
    assert first_down - (last_up - 2.0) >= 20.0 - 0.5
    assert first_down > 30.0  # and the traffic fell at 30 s
    assert not s.violations


def test_invariants_are_checked_in_every_replica(tmp_path: Path) -> None:
    """A violation injected into one replica's core state is reported, naming that replica."""

    class Corrupting(Runtime):
        async def run(self, model: str, request: Any, timeout_ms: int | None = None) -> Any:
            out = await super().run(model, request, timeout_ms)
            if request.get("duration") == 0.7:
                entry = self.core.registry.get(model)
                assert entry is not None
                entry.admission.ledger.double_releases.append(999)
            return out

    text = ONE_MODEL.replace("rate = 0.5", "rate = 0.0")
    trace = "0.0,a,0.5\n5.0,a,0.7\n9.0,a,0.5\n"  # the run ends at 9.5
    s = run_fleet(workload(text, tmp_path, trace), 0, runtime_factory=Corrupting)
    (served,) = [r.rid for r in s.per_replica if r.latency.count]  # affinity: both on one
    # seen at the step it happened (5.0 + 0.7), not only by the checks after shutdown
    assert s.violations == (f"t=5.700000 replica {served}: {_double_release_999()}",)
    clean = run_fleet(workload(text, tmp_path, "0.0,a,0.5\n5.0,a,0.6\n"), 0)
    assert not clean.violations


def _double_release_999() -> str:
    return "invariant 2 (a): double release of tickets [999]"


def test_the_decision_monitors_catch_a_runtime_mutant() -> None:
    w = workload(ONE_MODEL.replace("rate = 0.5", "rate = 6.0"))
    with activate("session_zero"):
        s = run_fleet(w, 1)
    assert any("used by two leases at once" in v for v in s.violations)
    assert not run_fleet(w, 1).violations


def test_a_small_sweep_answers_the_capacity_question(
    tmp_path: Path, small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(
        workload=str(small),
        seed=None,
        sweep_replicas="1..3",
        max_p99=1.5,
        max_busy_rate=0.01,
        out=str(tmp_path / "out"),
        no_monitors=False,
    )
    code = cmd_fleet.main(args)
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    meets = [r[-1] for r in rows]
    assert meets[-1] == "yes" and meets[0] == "no"
    first = 1 + meets.index("yes")
    assert f"smallest replica count meeting p99 <= 1.5 s and 503 rate <= 0.01: {first}" in out
    assert code == 0
    assert (tmp_path / "out" / "fleet.txt").read_text() in out
    assert (tmp_path / "out" / "fleet.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_errors_exit_2(tmp_path: Path, small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[replicas]\ncount = 1\n")
    ns = argparse.Namespace(
        workload=str(bad), seed=None, sweep_replicas=None, max_p99=None, max_busy_rate=None,
        out=None, no_monitors=True,
    )  # fmt: skip
    assert cmd_fleet.main(ns) == 2
    assert "models: at least one" in capsys.readouterr().err
    ns.workload, ns.sweep_replicas = str(small), "3..1"
    assert cmd_fleet.main(ns) == 2
    assert cmd_fleet.parse_range("2..5") == (2, 5) and cmd_fleet.parse_range("4") == (4, 4)


@pytest.mark.parametrize(("option", "value"), [("--max-p99", "-1"), ("--max-busy-rate", "nan")])
def test_cli_refuses_a_goal_no_run_can_meet(
    option: str, value: str, small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["sim", "fleet", str(small), "--sweep-replicas", "1..2", option, value])
    assert exit_.value.code == 2
    assert f"argument {option}: " in capsys.readouterr().err


def test_a_kill_of_no_replica_is_a_warning_not_a_violation() -> None:
    w = workload(ONE_MODEL + "[[events]]\nat = 1.0\nkill = 9\n")
    s = run_fleet(w, 0)
    assert not s.violations
    assert s.warnings == ("t=1.000000 kill: there is no replica 9",)
    assert "warning: t=1.000000 kill: there is no replica 9" in lines(s)


def test_the_picture_is_the_same_bytes_for_the_same_run(tmp_path: Path) -> None:
    w = workload(SMALL)
    runs = [run_fleet(w.with_replicas(n), 1) for n in (1, 2)]
    for name in ("a.png", "b.png"):
        report.draw(tmp_path / name, ["a", "b"], runs[1], runs)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_residency_is_checked_at_the_step_a_load_changes_it(tmp_path: Path) -> None:
    """A resident model whose memory is made to exceed the budget as its load publishes is seen
    at that step (residency is checked after decisions that can change it)."""
    from core.lifecycle import StartLoad

    class Swelling(Runtime):
        async def load(self, model: str, start: StartLoad) -> None:
            await super().load(model, start)
            entry = self.core.registry.get(model)
            assert entry is not None
            entry.memory_bytes = 5000

    text = """
[replicas]
count = 1
max_ongoing_requests = 2
memory_budget = 1000
[[models]]
id = "a"
slots = 1
memory = 100
load_time_s = 1.0
duration = 0.5
"""
    trace = "3.0,a\n9.0,a\n"  # loaded at 4.0; the run ends at 9.5
    s = run_fleet(workload(text, tmp_path, trace), 0, runtime_factory=Swelling)
    assert s.violations[0] == (
        "t=4.000000 replica 0: invariant 5 (*): resident memory exceeds the budget"
    )


def test_a_downscaled_replica_drains_then_fails_what_outlives_its_graceful_timeout(
    tmp_path: Path,
) -> None:
    text = """
[replicas]
count = 2
max_ongoing_requests = 1
graceful_shutdown_timeout_s = 2.0
[router]
retries = 0
[autoscaling]
min_replicas = 1
max_replicas = 2
target_ongoing_requests = 10.0
upscale_delay_s = 0.0
downscale_delay_s = 1.0
look_back_period_s = 1.0
interval_s = 0.5
[[models]]
id = "a"
slots = 1
load_time_s = 0.0
duration = 60.0
"""
    # two long requests, one per replica; two requests in flight against a target of 10 each
    # ask for one replica: after the downscale delay the newest replica (1) stops, drains for
    # 2 s and its request fails (no retries here); replica 0's finishes
    s = run_fleet(workload(text, tmp_path, "0.0,a\n0.0,a\n"), 0)
    assert s.counts[OK] == 1 and s.counts[FAILED] == 1
    stopped = s.per_replica[1]
    assert stopped.failed == 1 and stopped.latency.count == 0
    down = next(t for t, n in s.scale if n == 1)
    assert 1.0 <= down <= 2.5
    assert stopped.stopped_at == pytest.approx(down + 2.0)
    assert not s.violations
