"""No limit is None in typed APIs and 0 in the external formats, converted at the boundaries:
the runtime's settings (config file form) and the trace (written and replayed)."""

from __future__ import annotations

from core.replay import replay
from core.residency import ResidencyLimits
from server.runtime import RuntimeConfig
from sim.runner import run_scenario, runtime_config
from sim.scenario import parse


def test_runtime_settings_convert_zero_to_none() -> None:
    unlimited = RuntimeConfig()
    assert unlimited.residency_limits == ResidencyLimits(None, None)
    assert unlimited.idle_unload_seconds is None
    limited = RuntimeConfig(max_loaded_models=2, memory_budget=100, idle_unload_ms=1500)
    assert limited.residency_limits == ResidencyLimits(2, 100)
    assert limited.idle_unload_seconds == 1.5


def test_the_trace_writes_unbounded_as_zero_and_replays_it() -> None:
    scenario = parse(
        {
            "config": {"busy_timeout_ms": 0, "max_loaded_models": 0},
            "models": [{"id": "m", "lazy": False}],
            "actions": [
                {"at": 1.0, "do": "request", "id": "a", "model": "m", "duration": 2.0},
                {"at": 1.5, "do": "request", "id": "b", "model": "m", "duration": 1.0},
            ],
        }
    )
    assert runtime_config(scenario).residency_limits == ResidencyLimits()
    result = run_scenario(scenario)
    config = result.trace[0]
    assert config.event == "config" and config.args["max_loaded_models"] == 0
    requests = [r for r in result.trace if r.event == "request"]
    assert [r.args["timeout"] for r in requests] == [0.0, 0.0]
    assert [r.fields["outcome"] for r in requests] == ["granted", "queued"]
    assert replay(result.trace).divergence is None
