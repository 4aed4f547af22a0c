"""The three model families against their reference runtimes, side by side, in one run.

    python bench/models.py [--backend numpy|opencl|cuda] [--threads N,...] [--repeats N]
                           [--only FAMILY_OR_TASK,...]

Each family's bench (its registry entry's ``bench``, bench/model_*.py) measures
our numpy backend and the peer (onnxruntime for silero_vad and piper,
faster-whisper/ctranslate2 for whisper) on the same inputs with the same thread
count, alternating runs; ``--only`` takes family names or tasks, ``--threads`` one
count or several (one table each, with the load average before and after). This
prints one table: median latency, real-time factor (compute time / audio
duration) and our/peer ratio per input (goal <= 1.0; a reported figure).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:  # run as a script: the project, not bench/core.py
    sys.path.insert(0, str(ROOT))

from server.families import registry  # noqa: E402


def benches() -> dict[str, str]:
    """Family name -> its bench module, for every registered family that has one."""
    return {e.name: e.bench for e in registry.entries() if e.bench is not None}


def bench_of(key: str) -> str:
    """The bench module of ``key``: a family's name, or a task its only bench family serves."""
    found = benches()
    if key in found:
        return found[key]
    by_task = [found[e.name] for e in registry.entries() if e.task == key and e.name in found]
    if len(by_task) != 1:
        raise SystemExit(f"--only: {key!r} is not one of {', '.join(found)} (or their tasks)")
    return by_task[0]


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``ratio`` = our median / this row's median, per (model, input), and ``cpu_ratio``
    the same in process CPU time where both rows have ``cpu_ms`` (steadier on a shared
    machine)."""
    mine_rows = {(r["model"], r["input"]): r for r in rows if str(r["impl"]).startswith("voxpool-")}
    out = []
    for r in rows:
        mine = mine_rows.get((r["model"], r["input"]))
        if mine is None or str(r["impl"]).startswith("voxpool-"):
            out.append({**r, "ratio": None, "cpu_ratio": None})
            continue
        ratio = float(mine["median_ms"]) / float(r["median_ms"])
        cpu = None
        if "cpu_ms" in mine and "cpu_ms" in r and float(r["cpu_ms"]) > 0:
            cpu = float(mine["cpu_ms"]) / float(r["cpu_ms"])
        out.append({**r, "ratio": ratio, "cpu_ratio": cpu})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"| {'model':<15} | {'input':<28} | {'impl':<24} | "
        f"{'median ms':>10} | {'rtf':>8} | {'ours/peer':>9} | {'cpu o/p':>7} |"
    )
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        cpu = "" if r.get("cpu_ratio") is None else f"{r['cpu_ratio']:.2f}"
        lines.append(
            f"| {r['model']:<15} | {str(r['input'])[:28]:<28} | {r['impl']:<24} | "
            f"{float(r['median_ms']):>10.1f} | {float(r['rtf']):>8.4f} | {ratio:>9} | {cpu:>7} |"
        )
    return "\n".join(lines)


def thread_counts(text: str) -> list[int]:
    """``--threads``: one count or several, comma-separated ("1,2")."""
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--threads: positive counts, not {text!r}")
    return counts


def _load() -> str:
    """The 1-minute load average (a shared machine's figures need it), or "?"."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=thread_counts, default=[1])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=",".join(benches()))
    parser.add_argument("--backend", default="numpy", choices=["numpy", "opencl", "cuda"])
    args = parser.parse_args()
    for threads in args.threads:
        before = _load()
        rows: list[dict[str, Any]] = []
        for key in args.only.split(","):
            module = load(bench_of(key.strip()))
            rows.extend(module.bench(threads=threads, repeats=args.repeats, backend=args.backend))
        print(
            f"backend={args.backend} threads={threads} repeats={args.repeats} "
            f"load={before}->{_load()}"
        )
        print(table(with_ratios(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
