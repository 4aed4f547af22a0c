"""``voxpool sim replay``: recorded traces replay cleanly; edited or foreign ones diverge where
they differ."""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path

import pytest

import core.admission
from core.events import TraceRecord
from core.replay import PASSIVE_EVENTS, replay
from server.cli import main as cli_main
from sim.cmd_replay import read_trace
from sim.runner import run_scenario
from sim.scenario import load, parse

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
OVERDUE = SCENARIOS / "overdue_unload_waiting_1slot.toml"


def record(scenario: Path, path: Path, seed: int | None = None) -> list[TraceRecord]:
    with open(path, "w", encoding="utf-8") as out:
        result = run_scenario(load(scenario), seed, trace_out=out)
    return result.trace


def replay_cli(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli_main(["sim", "replay", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("scenario", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_scenario_trace_replays_without_divergence(
    scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = record(scenario, tmp_path / "trace.jsonl", seed=3)
    decisions = sum(1 for r in trace if r.event not in PASSIVE_EVENTS)
    assert decisions > 0
    code, out = replay_cli(tmp_path / "trace.jsonl", capsys)
    assert (code, out.strip()) == (0, f"all {decisions} decisions match")


def test_the_file_holds_what_the_run_recorded(tmp_path: Path) -> None:
    trace = record(OVERDUE, tmp_path / "trace.jsonl")
    assert read_trace(tmp_path / "trace.jsonl") == trace


def test_an_edited_decision_is_the_first_divergence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = record(OVERDUE, tmp_path / "trace.jsonl")
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    index = next(
        i for i, r in enumerate(trace) if r.event == "request" and r.decision.startswith("granted")
    )
    raw = json.loads(lines[index])
    granted = raw["decision"]
    raw["decision"] = "queued pos=0"
    lines[index] = json.dumps(raw)
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(lines) + "\n")
    code, out = replay_cli(edited, capsys)
    assert code == 1
    matching = sum(1 for r in trace[:index] if r.event not in PASSIVE_EVENTS)
    assert f"first divergence after {matching} matching decisions" in out
    assert f"seq {trace[index].seq} " in out
    assert f"recorded 'queued pos=0' (-), replayed '{granted}' (-)" in out


def test_a_trace_from_a_mutated_core_diverges_on_the_real_core(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the mutation: no holder ever counts as overrun, so the overdue rule never fires
    monkeypatch.setattr(core.admission, "overrun", lambda since, now, timeout: False)
    trace = record(OVERDUE, tmp_path / "mutant.jsonl")
    monkeypatch.undo()
    late = next(r for r in trace if r.event == "action" and r.args["id"] == "late")
    request = next(r for r in trace if r.event == "request" and r.seq > late.seq)
    assert request.decision.startswith("queued")  # what the mutant decided
    code, out = replay_cli(tmp_path / "mutant.jsonl", capsys)
    assert code == 1
    assert f"seq {request.seq} " in out
    assert "replayed 'rejected' (slots_overdue)" in out


def test_unreadable_traces_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq": 1}\nnot json\n')
    code, out = replay_cli(bad, capsys)
    assert code == 2 and "line 1" in out
    code, out = replay_cli(tmp_path / "missing.jsonl", capsys)
    assert code == 2 and "cannot read" in out
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(TraceRecord(1, 0.0, "m", "teleport").to_json() + "\n")
    code, out = replay_cli(unknown, capsys)
    assert code == 2 and "teleport" in out


AT_DEADLINE = """
name = "a request arrives at the instant a queued waiter's deadline comes"
[[models]]
id = "m"
slots = 1
lazy = false
[[actions]]
at = 0.9
do = "request"
id = "long"
model = "m"
duration = 3.1
[[actions]]
at = 1.0
do = "request"
id = "bounded"
model = "m"
timeout_ms = 2000
[[actions]]
at = 3.0
do = "request"
id = "at_deadline"
model = "m"
duration = 0.5
"""


class _Capped(io.StringIO):
    """A trace sink that stops a run that never ends (it used to livelock here)."""

    def write(self, text: str) -> int:
        if self.getvalue().count("\n") > 500:
            raise RuntimeError("the run does not end: livelock")
        return super().write(text)


@pytest.mark.parametrize("seed", range(4))
def test_an_arrival_at_a_queued_deadline_ends_and_replays(seed: int, tmp_path: Path) -> None:
    # Regression: the arrival's enqueue used to expire 'bounded' silently, and its
    # waiter then called expire() at its past deadline for ever (seeds 1-3).
    sink = _Capped()
    result = run_scenario(parse(tomllib.loads(AT_DEADLINE)), seed, trace_out=sink)
    outcomes = {k: (o.outcome, o.reason) for k, o in result.outcomes.items()}
    assert outcomes == {
        "long": ("ok", ""),
        "bounded": ("busy", "queue_timeout"),
        "at_deadline": ("ok", ""),
    }
    assert result.ok, result.violations
    path = tmp_path / "trace.jsonl"
    path.write_text(sink.getvalue())
    assert replay(read_trace(path)).divergence is None
