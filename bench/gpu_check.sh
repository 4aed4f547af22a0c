#!/usr/bin/env bash
# CUDA (cupy) checks for a GPU machine; installs nothing.
#
# Runs, from the repository root, with an environment that already has the
# project's dependencies plus cupy (the `cuda` extra, e.g. cupy-cuda12x):
#   1. the CUDA op comparisons (every ArrayBackend op vs numpy, declared tolerances),
#   2. the CUDA model parity (Silero VAD, Whisper tokens, Piper zero-noise audio),
#   3. the op micro-bench numpy vs cuda (and opencl when an OpenCL device is present).
# Results go to $OUT (default ./gpu_check_out): env.txt, cuda_ops.txt/.xml,
# cuda_models.txt/.xml, bench.txt, and summary.txt with each step's exit status.
#
#   OUT=/tmp/gpu PYTHON=.venv/bin/python bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3; fi

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi unavailable"
  "$PY" - <<'PY' 2>&1
import sys
print("python", sys.version.split()[0])
try:
    import cupy
    print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())
    print("device 0", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
except Exception as exc:
    print("cupy unavailable:", type(exc).__name__, exc)
    sys.exit(3)
PY
} > "$OUT/env.txt"
env_rc=$?
if [[ $env_rc -ne 0 ]]; then
  echo "cupy or a GPU is missing (see $OUT/env.txt); nothing to check" | tee "$OUT/summary.txt"
  exit 2
fi

"$PY" -m pytest tests/backends/test_cuda_ops.py -q -rs -p no:cacheprovider \
  --junitxml="$OUT/cuda_ops.xml" > "$OUT/cuda_ops.txt" 2>&1
ops_rc=$?
"$PY" -m pytest tests/backends/test_cuda_models.py -q -rs -s -p no:cacheprovider \
  --durations=0 --junitxml="$OUT/cuda_models.xml" > "$OUT/cuda_models.txt" 2>&1
models_rc=$?
timeout 600 "$PY" bench/backends.py --repeats 5 --backends numpy,cuda,opencl > "$OUT/bench.txt" 2>&1
bench_rc=$?

{
  echo "cuda op tests: exit $ops_rc ($(tail -n 1 "$OUT/cuda_ops.txt"))"
  echo "cuda model parity: exit $models_rc ($(tail -n 1 "$OUT/cuda_models.txt"))"
  echo "bench: exit $bench_rc"
} | tee "$OUT/summary.txt"
[[ $ops_rc -eq 0 && $models_rc -eq 0 && $bench_rc -eq 0 ]]
