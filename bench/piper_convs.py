"""Piper's convolutions on the numpy backend, each way side by side (issue #15).

    .venv/bin/python bench/piper_convs.py [--rounds 7] [--frames 255] [--threads 1]

On Piper's own weights (the bundled medium voice) and a random latent of ``--frames``
frames (255: a sentence of about 3 s), one BLAS thread by default, alternating in
one process (the machine's speed moves between runs; ratios within a run compare):

* the convs that take Winograd's products (``backends/piper/winograd.py``): the
  flow's 16 coupling in-layers (192 -> 384 channels, 5 taps) at the sentence's
  frames and the decoder's first conv (192 -> 256, 7 taps), against the same convs
  as one GEMM per tap (``blas.conv_taps``); and the first HiFi-GAN stage's
  undilated conv (128 channels, 3 taps, one 2,048-column tile), which does not take
  them (narrower than ``winograd.MIN_CHANNELS_PRODUCT``), as if it did;
* the three transposed convs (upsampling x8, x8, x4), per-tap GEMMs of phase rows
  then one interleaving pass (``host.conv_transpose``) against one GEMM a tile and
  the taps summed frame-major (``host._conv_transpose_matrix``, the path before);
* the whole flow and the whole HiFi-GAN both ways (``host.USE_WINOGRAD`` and the
  transposed conv switched together).

Prints the best of ``--rounds`` in milliseconds (CPU time of this process) and the
ratio new / before, and the largest difference between the two ways relative to the
largest output.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

import backends  # noqa: E402,F401  # before numpy: OpenBLAS's environment as the server has it

# isort: split
import numpy as np  # noqa: E402

from backends.piper import blas, flow, generator, host, load_model, winograd  # noqa: E402
from bench.common import blas_threads  # noqa: E402

Case = tuple[str, Callable[[], np.ndarray], Callable[[], np.ndarray]]


def _conv_case(label: str, cws: list[host.ConvWeights], src: np.ndarray, n: int) -> Case:
    """Each conv of ``cws`` over ``n`` columns of ``src``: Winograd's products (its own filters,
    or made here for a conv that does not take them) / one GEMM per tap."""
    outs = [np.zeros((cw.c_out, n), np.float32) for cw in cws]
    filters = [cw.winograd or winograd.filters(cw.taps) for cw in cws]

    def new() -> np.ndarray:
        for f, out in zip(filters, outs, strict=True):
            out[...] = 0
            assert f is not None
            winograd.conv_add(out, f, src, 0)
        return outs[-1].copy()

    def old() -> np.ndarray:
        for cw, out in zip(cws, outs, strict=True):
            out[...] = 0
            blas.conv_taps(out, cw.taps, src, 0, 1)
        return outs[-1].copy()

    return label, new, old


def _matrix_path(
    x: np.ndarray, uw: host.UpWeights, gaps: host.Gaps = (), out: np.ndarray | None = None
) -> np.ndarray:
    host.zero_gaps(x, gaps)
    if out is None:
        out = np.empty((uw.c_out, host.transposed_length(uw, x.shape[1])), np.float32)
    return host._conv_transpose_matrix(x, uw, out)


def _up_case(label: str, x: np.ndarray, uw: host.UpWeights) -> Case:
    """One transposed conv: phase rows and one interleaving pass / one GEMM a tile."""

    def new() -> np.ndarray:
        return host.conv_transpose(x, uw)

    def old() -> np.ndarray:
        return _matrix_path(x, uw)

    return label, new, old


def _switched(fn: Callable[[], np.ndarray], new: bool) -> Callable[[], np.ndarray]:
    """``fn`` with this change's paths (``new``) or the ones before, restored after."""

    def run() -> np.ndarray:
        saved = host.USE_WINOGRAD, host.conv_transpose
        host.USE_WINOGRAD = new
        host.conv_transpose = saved[1] if new else _matrix_path
        try:
            return fn()
        finally:
            host.USE_WINOGRAD, host.conv_transpose = saved

    return run


def cases(frames: int) -> list[Case]:
    model = load_model()
    prepared, h = model.prepared, model.hyper
    assert prepared is not None
    rng = np.random.default_rng(0)
    convs = prepared.convs
    in_layers = [cw for name, cw in convs.items() if ".enc.in_layers." in name]
    out: list[Case] = [
        _conv_case(
            f"flow in-layers x{len(in_layers)} (192->384, 5 taps, {frames} cols)",
            in_layers,
            rng.standard_normal((192, frames + 4), dtype=np.float32),
            frames,
        ),
        _conv_case(
            f"conv_pre (192->256, 7 taps, {frames} cols)",
            [convs["dec.conv_pre"]],
            rng.standard_normal((192, frames + 6), dtype=np.float32),
            frames,
        ),
        _conv_case(
            "stage 1 conv (128->128, 3 taps, 2048 cols; not taken)",
            [convs["dec.resblocks.0.convs.0"]],
            rng.standard_normal((128, 2050), dtype=np.float32),
            2048,
        ),
    ]
    t, c_in = frames, h.upsample_initial
    for i, u in enumerate(h.upsample_rates):
        uw = prepared.ups[f"dec.ups.{i}"]
        x = rng.standard_normal((c_in, t), dtype=np.float32)
        out.append(_up_case(f"ups.{i} ({c_in}->{c_in // 2}, x{u}, {t} frames)", x, uw))
        t, c_in = t * u, c_in // 2
    z = rng.standard_normal((h.inter, frames), dtype=np.float32)

    def whole_flow() -> np.ndarray:
        return flow.flow_reverse_host(convs, h, z)

    def whole_generator() -> np.ndarray:
        return generator.generate_host(prepared, h, z * np.float32(0.5))

    for label, fn in (("flow, whole", whole_flow), ("HiFi-GAN, whole", whole_generator)):
        out.append((f"{label} ({frames} frames)", _switched(fn, True), _switched(fn, False)))
    return out


def _best(fn: Callable[[], np.ndarray], times: list[float]) -> np.ndarray:
    c0 = time.process_time()
    result = fn()
    times.append(time.process_time() - c0)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frames", type=int, default=255)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    print("| conv | new ms | before ms | new / before | max diff / max |")
    print("|---|---:|---:|---:|---:|")
    with blas_threads(args.threads):
        for label, new, old in cases(args.frames):
            a, b = new(), old()  # warm-up, and the values
            diff = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
            times: tuple[list[float], list[float]] = ([], [])
            for _ in range(args.rounds):
                _best(new, times[0])
                _best(old, times[1])
            t_new, t_old = min(times[0]), min(times[1])
            print(
                f"| {label} | {t_new * 1e3:.2f} | {t_old * 1e3:.2f} | {t_new / t_old:.2f} "
                f"| {diff:.1e} |"
            )


if __name__ == "__main__":
    main()
