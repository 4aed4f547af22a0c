"""Fleet workloads: the format's errors name the field; durations and arrivals are as declared."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fleet.arrivals import arrivals
from sim.fleet.workload import MIN_DURATION, Duration, WorkloadError, load, parse

BASE = """
duration_s = 10.0
[replicas]
count = 2
[[models]]
id = "a"
rate = 1.0
"""

FLEET_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "fleet"


def doc(extra: str = "", base: str = BASE) -> dict[str, Any]:
    """``base`` with ``extra``: top-level keys before it, tables after it."""
    if extra and not extra.startswith("["):
        return tomllib.loads(extra + base)
    return tomllib.loads(base + extra)


def test_a_minimal_workload_parses_with_rays_defaults() -> None:
    w = parse(doc())
    assert w.replicas.count == 2
    assert w.router.max_queued_requests is None
    assert (w.router.backoff_initial_s, w.router.backoff_max_s) == (0.025, 0.5)
    assert w.router.multiplex_timeout_s == 1.0
    assert w.autoscaling is None
    # as the Ray deployment: slots 1, and as many again queued (no queue bound)
    assert w.max_ongoing == 2
    two = parse(
        doc(
            "[[models]]\nid = 'b'\nslots = 3\n",
            BASE.replace("count = 2", "count = 2\nmax_queue = 1"),
        )
    )
    assert two.max_ongoing == (1 + 1) + (3 + 1)
    scaled = parse(doc("[[models]]\nid = 'b'\nslots = 3\n[autoscaling]\nmax_replicas = 4\n"))
    assert scaled.autoscaling is not None and scaled.autoscaling.target_ongoing_requests == 4.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[models]]\nid = 'a'\n", "models: duplicate id(s) ['a']"),
        ("[[models]]\nslots = 2\n", "models[1].id: required"),
        ("[[models]]\nid = 'b'\nslots = 17\n", "models[1].slots: at most 16"),
        ("[[models]]\nid = 'b'\nslots = 0\n", "models[1].slots: must be >= 1"),
        ("[[models]]\nid = 'b'\nrate = -1\n", "models[1].rate: must be >= 0"),
        ("[[models]]\nid = 'b'\nload_time_s = 'x'\n", "models[1].load_time_s: expected a number"),
        ("[[models]]\nid = 'b'\ncolour = 1\n", "models[1]: unknown key(s) ['colour']"),
        ("[[models]]\nid = 'b'\nduration = 0\n", "models[1].duration: must be > 0"),
        ("[[models]]\nid = 'b'\nduration = []\n", "models[1].duration: expected a non-empty"),
        ("[[models]]\nid = 'b'\nduration = [0.5, -1]\n", "models[1].duration[1]"),
        (
            "[[models]]\nid = 'b'\nduration = { dist = 'gamma', mean = 1 }\n",
            "models[1].duration.dist: one of",
        ),
        (
            "[[models]]\nid = 'b'\nduration = { dist = 'normal', mean = 1 }\n",
            "models[1].duration.sd: required",
        ),
        (
            "[[models]]\nid = 'b'\nduration = { dist = 'exponential', mean = 0 }\n",
            "models[1].duration.mean: must be > 0",
        ),
        ("[router]\nmax_queued_requests = -2\n", "router.max_queued_requests"),
        ("[router]\nbackoff_multiplier = 0.5\n", "router.backoff_multiplier: must be >= 1"),
        ("[autoscaling]\nmin_replicas = 3\nmax_replicas = 2\n", "min_replicas 3 > max_replicas"),
        ("[autoscaling]\ntarget_ongoing_requests = 0\n", "target_ongoing_requests: must be > 0"),
        ("[[phases]]\nat = 5\nrates = { zz = 1.0 }\n", "phases[0].rates: unknown model 'zz'"),
        ("[[phases]]\nat = 5\n[[phases]]\nat = 1\n", "phases: must be in time order"),
        ("[[events]]\nat = 5\n", "events[0]: the only event is kill"),
        ("scheduling = 'sometimes'\n", "scheduling: one of"),
        ("extra = 1\n", "unknown key(s) ['extra']"),
    ],
)
def test_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(WorkloadError) as err:
        parse(doc(text))
    assert message in str(err.value)


def test_replicas_and_duration_are_required() -> None:
    with pytest.raises(WorkloadError, match=r"replicas: required"):
        parse(tomllib.loads("duration_s = 1.0\n[[models]]\nid = 'a'\nrate = 1.0\n"))
    with pytest.raises(WorkloadError, match=r"duration_s: required"):
        parse(tomllib.loads("[replicas]\ncount = 1\n[[models]]\nid = 'a'\nrate = 1.0\n"))
    with pytest.raises(WorkloadError, match=r"no model has a rate"):
        parse(tomllib.loads("duration_s = 1.0\n[replicas]\ncount = 1\n[[models]]\nid = 'a'\n"))


def test_trace_errors_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("# at,model\n0.5,a\n0.2,a\n")
    with pytest.raises(WorkloadError, match=r"line 3: times must be finite and non-decreasing"):
        parse(doc("trace = 't.csv'\n"), tmp_path)
    (tmp_path / "t.csv").write_text("0.5,zz\n")
    with pytest.raises(WorkloadError, match=r"line 1: unknown model 'zz'"):
        parse(doc("trace = 't.csv'\n"), tmp_path)
    with pytest.raises(WorkloadError, match=r"trace: cannot read missing.csv"):
        parse(doc("trace = 'missing.csv'\n"), tmp_path)


def test_a_file_that_is_not_toml_says_so(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[replicas\n")
    with pytest.raises(WorkloadError, match=r"not valid TOML"):
        load(path)


def test_zero_replicas_need_an_autoscaler() -> None:
    with pytest.raises(WorkloadError, match=r"replicas.count: 0 replicas and no \[autoscaling\]"):
        parse(doc(base=BASE.replace("count = 2", "count = 0")))
    assert parse(doc("[autoscaling]\nmin_replicas = 0\n", BASE.replace("count = 2", "count = 0")))


def test_the_fleet_examples_are_not_taken_for_lifecycle_scenarios() -> None:
    from tests.sim.test_scenarios import SCENARIOS

    assert SCENARIOS and not any(p.parent.name == "fleet" for p in SCENARIOS)


def test_the_example_workloads_parse() -> None:
    paths = sorted(FLEET_DIR.glob("*.toml"))
    assert len(paths) >= 3
    for path in paths:
        assert load(path).description.strip(), path.name


@given(
    st.sampled_from(["fixed", "exponential", "normal", "lognormal"]),
    st.floats(0.01, 10.0),
    st.floats(0.0, 5.0),
    st.integers(0, 2**32),
)
@settings(max_examples=200, deadline=None)
def test_durations_are_positive_and_seeded(dist: str, mean: float, sd: float, seed: int) -> None:
    d = Duration(dist, mean, sd)
    a = [d.draw(random.Random(seed)) for _ in range(5)]
    b = [d.draw(random.Random(seed)) for _ in range(5)]
    assert a == b
    assert all(x >= MIN_DURATION for x in a)
    if dist == "fixed":
        assert a == [mean] * 5


def test_measured_samples_are_drawn_from_the_list() -> None:
    w = parse(doc("[[models]]\nid = 'b'\nrate = 1.0\nduration = [0.3, 0.5, 0.7]\n"))
    d = w.model("b").duration
    assert d.dist == "samples" and d.mean == pytest.approx(0.5)
    rng = random.Random(3)
    assert {d.draw(rng) for _ in range(100)} == {0.3, 0.5, 0.7}


def test_poisson_arrivals_follow_the_rates_and_the_phases() -> None:
    w = parse(
        doc(
            "[[models]]\nid = 'b'\nrate = 0.0\n"
            "[[phases]]\nat = 5.0\nrates = { a = 0.0, b = 40.0 }\n",
            base=BASE.replace("duration_s = 10.0", "duration_s = 10.0").replace(
                "rate = 1.0", "rate = 40.0"
            ),
        )
    )
    got = list(arrivals(w, 1))
    assert [a.n for a in got] == list(range(len(got)))
    assert all(a.model == "a" for a in got if a.at < 5.0)
    assert all(a.model == "b" for a in got if a.at >= 5.0)
    before = sum(1 for a in got if a.at < 5.0)
    assert 120 < before < 280  # 40/s for 5 s
    assert got == list(arrivals(w, 1))
    assert got != list(arrivals(w, 2))


def test_a_request_cap_and_a_trace(tmp_path: Path) -> None:
    assert len(list(arrivals(parse(doc("requests = 7\n")), 0))) <= 7
    (tmp_path / "t.csv").write_text("0.0,a,2.5\n1.0,a\n")
    w = parse(doc("trace = 't.csv'\n"), tmp_path)
    got = list(arrivals(w, 0))
    assert [(a.at, a.model) for a in got] == [(0.0, "a"), (1.0, "a")]
    assert got[0].duration == 2.5
