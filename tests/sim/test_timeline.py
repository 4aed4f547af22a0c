"""The timeline: lanes, bars and queue depth read from a run's trace, drawn as SVG and PNG."""

from __future__ import annotations

import itertools
import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

from server.cli import main as cli_main
from sim.runner import RunResult, run_scenario
from sim.scenario import Scenario, parse
from sim.timeline import Timeline, build, draw, outcome_colour

# Twenty actions on two models: queueing, an overdue rejection, a run failure, a
# client that leaves while queued, a stream, a batch, a reconfiguration to 3 slots
# with work queued behind it, unloads and a bulk unload followed by cold reloads.
TWENTY = """
name = "twenty actions"
[[models]]
id = "a"
slots = 2
lazy = false
[[models]]
id = "b"
slots = 1
[[actions]]
at = 1.0
do = "request"
id = "r1"
model = "a"
duration = 3.0
[[actions]]
at = 1.0
do = "request"
id = "r2"
model = "a"
duration = 2.0
[[actions]]
at = 1.1
do = "request"
id = "r3"
model = "a"
duration = 1.0
[[actions]]
at = 1.2
do = "stream"
id = "s1"
model = "a"
chunks = 3
chunk_time = 0.5
[[actions]]
at = 1.3
do = "request"
id = "r4"
model = "a"
timeout_ms = 100
[[actions]]
at = 1.5
do = "reconfigure"
id = "c1"
model = "a"
slots = 3
path = "rev2"
[[actions]]
at = 1.6
do = "request"
id = "r5"
model = "a"
duration = 1.0
[[actions]]
at = 1.7
do = "request"
id = "r6"
model = "a"
duration = 1.0
[[actions]]
at = 1.8
do = "request"
id = "r7"
model = "a"
duration = 0.5
fail = true
[[actions]]
at = 1.0
do = "request"
id = "rb1"
model = "b"
duration = 2.0
[[actions]]
at = 1.1
do = "request"
id = "rb2"
model = "b"
duration = 1.0
[[actions]]
at = 1.2
do = "request"
id = "rb3"
model = "b"
duration = 1.0
[[actions]]
at = 1.5
do = "disconnect"
id = "x1"
target = "rb3"
[[actions]]
at = 2.0
do = "batch"
id = "bt1"
model = "b"
count = 2
duration = 0.5
[[actions]]
at = 6.0
do = "unload"
id = "ub"
model = "b"
[[actions]]
at = 6.1
do = "request"
id = "rb4"
model = "b"
duration = 0.5
[[actions]]
at = 9.0
do = "bulk_unload"
id = "bulk1"
ids = ["a", "b"]
[[actions]]
at = 9.0
do = "request"
id = "r8"
model = "a"
duration = 1.0
[[actions]]
at = 12.0
do = "request"
id = "r9"
model = "a"
duration = 0.5
[[actions]]
at = 12.0
do = "load"
id = "l1"
model = "b"
"""

REQUESTS = ("request", "stream", "batch")


@pytest.fixture(scope="module")
def twenty() -> tuple[Scenario, RunResult]:
    scenario = parse(tomllib.loads(TWENTY))
    assert len(scenario.actions) == 20
    result = run_scenario(scenario)
    assert result.ok, result.violations
    return scenario, result


@pytest.fixture(scope="module")
def timeline(twenty: tuple[Scenario, RunResult]) -> Timeline:
    return build(twenty[1])


def test_the_scenario_does_what_the_picture_should_show(twenty: tuple[Scenario, RunResult]) -> None:
    outcomes = {k: o.outcome for k, o in twenty[1].outcomes.items()}
    assert outcomes["r4"] == "busy"
    assert outcomes["r7"] == "error"
    assert outcomes["rb3"] == "cancelled"
    assert {
        outcomes[k]
        for k in ("r1", "r2", "r3", "s1", "c1", "r5", "r6", "bt1", "ub", "rb4", "bulk1", "r8", "r9")
    } == {"ok"}


def test_one_request_bar_per_request_action(
    twenty: tuple[Scenario, RunResult], timeline: Timeline
) -> None:
    scenario, result = twenty
    wanted = {a.id for a in scenario.actions if a.do in REQUESTS}
    bars = [b for b in timeline.bars if b.kind == "request"]
    assert len(bars) == len(wanted) == 15
    assert {b.action for b in bars} == wanted
    for bar in bars:
        assert bar.colour == outcome_colour(result.outcomes[str(bar.action)].outcome)


def test_lanes_follow_the_slot_counts(timeline: Timeline) -> None:
    lanes = defaultdict(list)
    for model, name in timeline.lanes:
        lanes[model].append(name)
    # a: 2 slots, reconfigured to 3; b: 1 slot; both had a request that never got a slot
    assert lanes["a"] == ["mgmt", "slot 0", "slot 1", "slot 2", "rejected"]
    assert lanes["b"] == ["mgmt", "slot 0", "rejected"]
    assert all(bar.lane in timeline.lanes for bar in timeline.bars)


def test_rejected_lane_holds_exactly_the_requests_that_never_got_a_slot(timeline: Timeline) -> None:
    rejected = {b.action for b in timeline.bars if b.kind == "request" and b.lane[1] == "rejected"}
    assert rejected == {"r4", "rb3"}


def test_request_bars_never_overlap_on_a_slot(timeline: Timeline) -> None:
    per_lane = defaultdict(list)
    for bar in timeline.bars:
        if bar.kind == "request" and bar.lane[1].startswith("slot"):
            per_lane[bar.lane].append((bar.start, bar.end))
    assert per_lane
    for spans in per_lane.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start + 1e-9


def test_barriers_separate_old_and_new_work(timeline: Timeline) -> None:
    barriers = defaultdict(list)
    for bar in timeline.bars:
        if bar.kind == "barrier" and bar.action is not None:
            barriers[bar.action].append(bar)
    assert sorted(barriers) == ["bulk1", "c1", "l1", "ub"]
    assert sorted(b.lane[0] for b in barriers["bulk1"]) == ["a", "b"]
    (reconf,) = barriers["c1"]
    requests = {b.action: b for b in timeline.bars if b.kind == "request"}
    for before in ("r1", "r2", "r3", "s1"):
        assert requests[before].end <= reconf.start
    for after in ("r5", "r6", "r7"):
        assert requests[after].start >= reconf.end
    # the reconfiguration waited in the queue before it held the model
    assert any(b.kind == "wait" and b.action == "c1" for b in timeline.bars)


def test_loads_and_teardowns_are_drawn_on_the_management_lane(timeline: Timeline) -> None:
    loads = [b for b in timeline.bars if b.kind == "load"]
    teardowns = [b for b in timeline.bars if b.kind == "teardown"]
    # b: cold load for rb1, reload for rb4 after its unload, explicit load l1;
    # a: eager, reconfigure, r8
    assert sum(1 for b in loads if b.lane == ("b", "mgmt")) == 3
    assert sum(1 for b in loads if b.lane == ("a", "mgmt")) == 3
    assert all(b.end > b.start for b in loads)
    assert {b.lane[0] for b in teardowns} == {"a", "b"}
    assert all(b.lane[1] == "mgmt" for b in loads + teardowns)


def test_queue_depth(timeline: Timeline) -> None:
    depth_a = timeline.queue["a"]
    assert all(n >= 0 for _, n in depth_a)
    assert depth_a[-1][1] == 0 and timeline.queue["b"][-1][1] == 0
    # r3, s1, then c1, r5, r6, r7 queue behind the two busy slots of 'a' (r4 is rejected at once)
    assert max(n for _, n in depth_a) == 6
    assert [t for t, _ in depth_a] == sorted(t for t, _ in depth_a)


def _svg_bar_ids(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return [el.get("id", "") for el in root.iter() if el.get("id", "").startswith("bar-")]


def test_svg_is_valid_and_holds_every_bar(
    twenty: tuple[Scenario, RunResult], timeline: Timeline, tmp_path: Path
) -> None:
    path = tmp_path / "twenty.svg"
    draw(twenty[1], str(path))
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    ids = _svg_bar_ids(path)
    for kind in ("request", "barrier", "wait", "load", "teardown"):
        assert sum(1 for i in ids if i.startswith(f"bar-{kind}-")) == timeline.count(kind)
    text = " ".join(t for el in root.iter() for t in [el.text] if t)
    for word in ("virtual time (s)", "queue depth", "request: busy", "a  slot 2", "b  rejected"):
        assert word in text
    assert path.stat().st_size < 300_000


def test_png_has_the_png_signature(twenty: tuple[Scenario, RunResult], tmp_path: Path) -> None:
    path = tmp_path / "twenty.png"
    draw(twenty[1], str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"\.svg or \.png"):
        draw(twenty[1], str(tmp_path / "twenty.pdf"))


def test_sim_run_plot_writes_the_picture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = (
        Path(__file__).resolve().parents[2] / "scenarios" / "overdue_unload_waiting_1slot.toml"
    )
    out = tmp_path / "t.svg"
    assert cli_main(["sim", "run", str(scenario), "--plot", str(out)]) == 0
    assert "timeline drawn" in capsys.readouterr().out
    ids = _svg_bar_ids(out)
    assert sum(1 for i in ids if i.startswith("bar-request-")) == 2
