"""Every scenario file holds for its own seed and for other seeds (every legal interleaving)."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest

from server.cli import main as cli_main
from sim import cmd_run
from sim.runner import check_expectations, run_scenario
from sim.scenario import load

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.toml"))
OTHER_SEEDS = (1, 2, 3, 7, 1234, 99)


def test_the_catalogue_is_large_enough() -> None:
    assert len(SCENARIOS) >= 25


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_holds_for_every_seed(path: Path) -> None:
    scenario = load(path)
    assert scenario.description.strip(), "every scenario says why it exists"
    assert scenario.expect, "every scenario checks outcomes"
    seeds = [scenario.seed, *[s for s in OTHER_SEEDS if s != scenario.seed][:5]]
    for seed in seeds:
        result = run_scenario(scenario, seed)
        assert not result.stalled, f"seed {seed}: stalled"
        assert check_expectations(scenario, result) == [], f"seed {seed}"


def _args(file: Path, **kw: object) -> argparse.Namespace:
    return argparse.Namespace(
        file=str(file), seed=kw.get("seed"), trace=kw.get("trace"), plot=kw.get("plot")
    )


EXAMPLE = Path(__file__).resolve().parents[2] / "scenarios" / "overdue_unload_waiting_1slot.toml"


def test_sim_run_prints_the_table_and_writes_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    assert cmd_run.main(_args(EXAMPLE, trace=str(trace))) == 0
    out = capsys.readouterr().out
    assert "id    " in out and "outcome" in out
    assert "late    request  m" in out and "slots_overdue" in out
    assert out.rstrip().endswith(f"trace written to {trace}")
    assert trace.read_text() == run_scenario(load(EXAMPLE)).trace_text()


def test_sim_run_fails_on_an_unmet_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text(
        EXAMPLE.read_text().replace('reason = "slots_overdue"', 'reason = "queue_timeout"')
    )
    assert cmd_run.main(_args(broken, seed=3)) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "late: reason 'slots_overdue', expected 'queue_timeout'" in out


def test_sim_run_rejects_an_unreadable_scenario(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[actions]]\ndo = "explode"\n')
    assert cmd_run.main(_args(bad)) == 2


def test_sim_run_plot_uses_the_timeline_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    drawn: list[tuple[str, str]] = []
    stub = types.ModuleType("sim.timeline")
    stub.draw = lambda result, path: drawn.append((result.scenario, path))  # type: ignore[attr-defined]
    stub.SUFFIXES = (".svg",)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sim.timeline", stub)
    plot = str(tmp_path / "t.svg")
    assert cmd_run.main(_args(EXAMPLE, plot=plot)) == 0
    assert drawn == [(load(EXAMPLE).name, plot)]
    assert cmd_run.main(_args(EXAMPLE, plot=str(tmp_path / "t.png"))) == 2
    assert "use .svg" in capsys.readouterr().err, "the module's own formats"
    monkeypatch.setitem(sys.modules, "sim.timeline", None)
    assert cmd_run.main(_args(EXAMPLE, plot=plot)) == 2
    assert "--plot needs sim/timeline.py" in capsys.readouterr().err


def _must_not_run(*_args: object, **_kw: object) -> None:
    raise AssertionError("the arguments were refused: the scenario may not run")


def test_sim_run_refuses_a_plot_format_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cmd_run, "run_scenario", _must_not_run)
    assert cli_main(["sim", "run", str(EXAMPLE), "--plot", str(tmp_path / "x.gif")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x.gif: unsupported format; use .svg or .png" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option", ["--trace", "--plot"])
def test_sim_run_refuses_an_output_in_a_missing_directory(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cmd_run, "run_scenario", _must_not_run)
    out = tmp_path / "missing" / "t.svg"
    with pytest.raises(SystemExit) as exit_:
        cli_main(["sim", "run", str(EXAMPLE), option, str(out)])
    assert exit_.value.code == 2
    assert f"argument {option}: cannot write '{out}': no directory" in capsys.readouterr().err
