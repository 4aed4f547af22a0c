"""The ``voxpool`` command line: serve, run a model once, Ray Serve, and the simulator.

Production code never imports :mod:`sim`; only the ``sim`` subcommands load
it, lazily.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from core.pool import MAX_BATCH_SLOTS, MAX_PARALLEL_SESSIONS
from server import cmd_ray
from server.families import registry


def output_file(text: str) -> str:
    """``text`` if a command may write the file: not a directory, in an existing directory it
    may write to (checked as the arguments are parsed, before any long work)."""
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no directory {str(folder)!r}")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: permission denied")
    return text


def request_seed(text: str) -> int:
    """``text`` as a model request's seed: an integer in the range the server's requests accept
    (:data:`server.families.http.SEED_MAX`, Piper's and Whisper's own bound)."""
    from server.families.http import SEED_MAX

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..{SEED_MAX}, got {text}")
    return value


def _number(text: str) -> float:
    """``text`` as a number that is not NaN (no comparison with NaN ever holds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """``text`` as a time budget: finite and > 0 (an infinite one never ends its search)."""
    value = _number(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def at_least_zero(text: str) -> float:
    """``text`` as a goal's bound: >= 0 (a negative latency or rate can never be met)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voxpool", description="Audio model server with parallel session slots."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP server (no config: the embedded default)")
    serve.add_argument("--config", help="audio.cpp server.json")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--parallel-jobs", action="store_true", help="select the parallel runtime")
    serve.add_argument("--trace", help="write the runtime trace (JSON lines) to this file")
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help=(
            "voxpool's log on stderr: info has one access line per request (status polls at debug)"
        ),
    )

    tasks = registry.tasks()
    run = sub.add_parser("run", help=f"run one model once ({', '.join(tasks)})")
    run.add_argument("task", choices=tasks)
    run.add_argument("input", nargs="?", help="input WAV (asr, vad)")
    run.add_argument("--text", help="text to speak (tts)")
    run.add_argument(
        "-o",
        "--output",
        type=output_file,
        help="output file: tts audio in the format its suffix names (.wav, .mp3, ...: the "
        "server's response formats); asr and vad write their result as the server's JSON",
    )
    run.add_argument("--backend", default="numpy", choices=["numpy", "cpu", "opencl", "cuda"])
    run.add_argument("--seed", type=request_seed, default=0)

    val = sub.add_parser(
        "validate",
        help="the model validation procedure's admission gate for one family at one slot count",
    )
    val.add_argument("--model", required=True, choices=registry.validated())
    val.add_argument(
        "--slots",
        type=int,
        default=2,
        help=f"1..{MAX_PARALLEL_SESSIONS} (1..{MAX_BATCH_SLOTS} with --batching: engine rows)",
    )
    val.add_argument("--starts", type=int, default=3, help="fresh runtime starts (seed minimum 3)")
    val.add_argument(
        "--waves", type=int, default=10, help="mixed warm waves per start (seed minimum 10)"
    )
    val.add_argument(
        "--batching",
        action="store_true",
        help='register the model with "batching": true (its batched engine, slots = batch size)',
    )
    val.add_argument(
        "--load-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the model's load_options, as in the config (e.g. batch_math=gemm); repeatable",
    )
    val.add_argument("--framework", action="store_true", help="also run the F1-F6 test subsets")
    val.add_argument("--out", type=output_file, help="write the JSON record here")

    cmd_ray.add_parser(sub)

    sim = sub.add_parser("sim", help="the deterministic simulator")
    simsub = sim.add_subparsers(dest="sim_command", required=True)
    srun = simsub.add_parser("run", help="run a scenario file and check its expectations")
    srun.add_argument("file")
    srun.add_argument("--seed", type=int)
    srun.add_argument("--trace", type=output_file, help="write the trace (JSON lines) here")
    srun.add_argument("--plot", type=output_file, help="draw the timeline (.svg or .png)")
    fuzz = simsub.add_parser("fuzz", help="search random workloads for invariant violations")
    fuzz.add_argument("--budget", type=positive_seconds, default=60.0, help="seconds of search")
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--out", default="fuzz-out", help="where shrunk failures are written")
    fuzz.add_argument("--mutant", help=argparse.SUPPRESS)  # tests/mutants: fuzz a re-introduced bug
    replay = simsub.add_parser("replay", help="re-feed a recorded trace to a fresh core")
    replay.add_argument("trace")
    fleet = simsub.add_parser(
        "fleet", help="many replicas behind a Ray Serve router model: latency, 503s, sweeps"
    )
    fleet.add_argument("workload", help="the workload TOML file (docs/fleet.md)")
    fleet.add_argument("--seed", type=int, help="default: the workload's seed")
    fleet.add_argument("--sweep-replicas", metavar="A..B", help="run on A..B fixed replicas")
    fleet.add_argument(
        "--max-p99", type=at_least_zero, metavar="SECONDS", help="a sweep's p99 goal"
    )
    fleet.add_argument(
        "--max-busy-rate", type=at_least_zero, metavar="FRACTION", help="503-rate goal"
    )
    fleet.add_argument("--out", help="write fleet.txt and fleet.png here")
    fleet.add_argument("--no-monitors", action="store_true", help="skip the decision monitors")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "sim":
        module = importlib.import_module(f"sim.cmd_{args.sim_command}")
        return int(module.main(args))
    module = importlib.import_module(f"server.cmd_{args.command}")
    return int(module.main(args))


if __name__ == "__main__":
    sys.exit(main())
