"""A Whisper decoding step split by the spinning helpers (backends/handoff.py) or not.

    .venv/bin/python bench/handoff.py [--members 1,2,4,8] [--rounds 6] [--steps 40]

On a share of two cores (``parallel.SHARE.set_threads(2)``, what the server gives a
call alone on a 2-core machine), each round runs ``--steps`` decoding steps of
``--members`` members (random 30 s windows, Whisper tiny.en's weights) with the
helpers (``handoff.ENABLED``) and then without them (the thread pool splits only the
vocabulary projection, as before), alternating, and prints the median step's decoder
layers (``_decode``: products, self- and cross-attention) and vocabulary projection
(``logits``) in milliseconds, with the ratio helpers / pool. The two give the same
bits (checked). Also the layer weights of one step alone (24 products of one row,
33 MB, from memory) both ways. ``--requests N``: then each Whisper fixture transcribed
whole by a session with 2 BLAS threads (threadpoolctl), N times each way, alternating
(the same texts, checked), median milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

import backends  # noqa: E402,F401  # before numpy: OpenBLAS's environment as the server has it

# isort: split
import numpy as np  # noqa: E402

from backends import handoff, panels, parallel  # noqa: E402
from backends.numpy_backend import NumpyBackend  # noqa: E402
from backends.whisper import model  # noqa: E402
from backends.whisper.ct2_reader import read_ct2_model  # noqa: E402
from backends.whisper.session import default_model_dir  # noqa: E402


def _states(be: NumpyBackend, w: model.WhisperWeights, members: int) -> list[model.DecoderState]:
    rng = np.random.default_rng(members)
    states = []
    for _ in range(members):
        state = model.DecoderState(be, w)
        state.set_memory(rng.normal(size=(1, 1500, w.d_model)).astype(np.float32))
        model.decode(be, w, state, np.asarray([[50257, 50362]], dtype=np.int64))
        states.append(state)
    return states


def _steps(
    be: NumpyBackend, w: model.WhisperWeights, states: list[model.DecoderState], steps: int
) -> tuple[float, float, np.ndarray]:
    """Median decoder-layer and logits seconds of ``steps`` steps, and the last logits."""
    for state in states:
        state.length = 2
    layers, vocab = [], []
    logits = np.empty(0)
    for i in range(steps):
        t0 = time.perf_counter()
        tokens = [np.asarray([[440 + i]], dtype=np.int64)] * len(states)
        hidden, _ = model._decode(be, w, states, tokens, (), 1)
        t1 = time.perf_counter()
        logits = np.asarray(model.logits(be, w, hidden))
        layers.append(t1 - t0)
        vocab.append(time.perf_counter() - t1)
    return statistics.median(layers), statistics.median(vocab), logits


def _layer_products(w: model.WhisperWeights, rounds: int) -> dict[bool, float]:
    weights = []
    for layer in w.dec_layers:
        a, c, f = layer.self_attn, layer.cross_attn, layer.ffn
        weights += [a.w_in, a.w_out, c.w_q, c.w_out, f.w1, f.w2]
    rows = {p.in_features: np.ones((1, p.in_features), np.float32) for p in weights}
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds * 10):
        for flag in (True, False):
            handoff.ENABLED = flag
            t0 = time.perf_counter()
            for p in weights:
                panels.linear(rows[p.in_features], p, None, lanes=2)
            times[flag].append(time.perf_counter() - t0)
    return {flag: statistics.median(ts) for flag, ts in times.items()}


def _requests(repeats: int) -> None:
    """Whole transcriptions with the helpers and without, alternating, on 2 BLAS threads."""
    from backends.whisper import WhisperRequest, load_factory
    from bench.common import blas_threads
    from bench.model_whisper import _fixtures, _interleaved, _use_repo_root

    _use_repo_root()
    print("\n| input | helpers ms | pool ms | ratio |\n|---|---:|---:|---:|")
    with blas_threads(2):
        session = load_factory().create()
        for name, audio in _fixtures():
            texts: dict[bool, str] = {}

            def run(flag: bool, audio: np.ndarray = audio, texts: dict[bool, str] = texts) -> None:
                handoff.ENABLED = flag
                texts[flag] = session.run(WhisperRequest(audio)).text

            medians = _interleaved({"on": lambda: run(True), "off": lambda: run(False)}, repeats)
            if texts[True] != texts[False]:
                raise SystemExit(f"{name}: the helpers' text differs from the pool's")
            on, off = medians["on"][0] * 1e3, medians["off"][0] * 1e3
            print(f"| {name} | {on:.1f} | {off:.1f} | {on / off:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--members", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--requests", type=int, default=0)
    args = p.parse_args()
    if not handoff.ENABLED:
        raise SystemExit("the helpers are off here (not x86-64, or VOXPOOL_HANDOFF=0)")
    be = NumpyBackend()
    w = model.load_weights(read_ct2_model(default_model_dir()), be)
    parallel.SHARE.set_threads(2)
    print(
        "| members | layers, helpers ms | layers, pool ms | ratio "
        "| logits, helpers ms | logits, pool ms | ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for members in (int(m) for m in args.members.split(",")):
        states = _states(be, w, members)
        got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        last: dict[bool, np.ndarray] = {}
        for _ in range(args.rounds):
            for flag in (True, False):
                handoff.ENABLED = flag
                layers, vocab, last[flag] = _steps(be, w, states, args.steps)
                got[flag].append((layers, vocab))
        if last[True].tobytes() != last[False].tobytes():
            raise SystemExit("the helpers' logits differ from the pool's")
        on = [statistics.median(v[k] for v in got[True]) * 1e3 for k in (0, 1)]
        off = [statistics.median(v[k] for v in got[False]) * 1e3 for k in (0, 1)]
        print(
            f"| {members} | {on[0]:.2f} | {off[0]:.2f} | {on[0] / off[0]:.2f} "
            f"| {on[1]:.2f} | {off[1]:.2f} | {on[1] / off[1]:.2f} |"
        )
    products = _layer_products(w, args.rounds)
    print(
        f"\none step's 24 layer products (33 MB, one row): helpers {products[True] * 1e3:.2f} ms, "
        f"pool {products[False] * 1e3:.2f} ms, ratio {products[True] / products[False]:.2f}"
    )
    parallel.SHARE.set_threads(None)
    if args.requests:
        _requests(args.requests)
    handoff.ENABLED = True


if __name__ == "__main__":
    main()
