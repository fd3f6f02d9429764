#!/usr/bin/env bash
# The book's checks on a machine with a CUDA GPU and no network.
#
# Here (with network):   make gpu-kit          # wheels the GPU machine lacks, in .gpu-kit/ (about 30 MB)
# There, one step per command (each well under 10 minutes), with .gpu-kit carried along:
#   bash benchmarks/on_gpu.sh tests           # install, then the CUDA tests (about 2 minutes; `tests all`: CPU cases too)
#   bash benchmarks/on_gpu.sh bench           # attention benchmark in bf16, n = 512 ... 32768, and training throughput
#   bash benchmarks/on_gpu.sh bench --lengths 8192 32768 --rounds 2   # shorter (arguments go to attention.py)
#   bash benchmarks/on_gpu.sh profile         # where FlexAttention's time goes (benchmarks/flex_profile.py), n = 16384
#   bash benchmarks/on_gpu.sh chapters 07     # chapters in full mode, timed, executed notebooks kept
#   bash benchmarks/on_gpu.sh next            # what is still open, in one command (about 8 minutes): the profile
#                                             # variants that split the tables' forward cost, then chapter 7 in
#                                             # small mode on the GPU (what a Colab reader who picks small gets)
# Results go to $OUT (the device tool's folder) or _build/gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-_build/gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

install() {
  $PY -c "import nbclient, plotly, ipykernel, ipywidgets" 2>/dev/null || \
    $PY -m pip install -q --no-index --find-links .gpu-kit/wheels plotly nbclient nbformat ipykernel ipywidgets
  $PY -c "import posenc" 2>/dev/null || $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . || true
  if ! $PY -c "import posenc" 2>/dev/null; then  # an old setuptools there: import the package from the tree
    mkdir -p /tmp/posenc-path && ln -sfn "$PWD/src/lib" /tmp/posenc-path/posenc
    export PYTHONPATH=/tmp/posenc-path${PYTHONPATH:+:$PYTHONPATH}
  fi
  $PY -m ipykernel install --user --name python3 >/dev/null
  $PY -c "import torch, posenc; print('torch', torch.__version__, '|', torch.cuda.get_device_name(0), '| posenc', posenc.__file__)"
}

step=${1:-}
shift || true
case "$step" in
  tests)
    install
    # the CUDA cases (about 2 minutes on an H200, 80 s of it compiling FlexAttention at every length);
    # `tests all` adds the CPU cases of the attention tests (over 3 minutes more)
    if [ "${1:-}" = all ]; then more="tests/test_relative_attention.py tests/test_attention.py tests/test_sinks.py"; mark=; else more=; mark="-m cuda"; fi
    $PY -m pytest tests/test_cuda.py tests/test_runtime.py $more $mark -v -p no:cacheprovider \
      --durations=10 2>&1 | tee "$OUT/tests.txt" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tail -40 ;;
  bench)
    install
    gpu=$($PY -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())")
    $PY benchmarks/attention.py --out "$OUT/attention-$gpu.csv" "$@" 2>&1 | tail -40
    $PY benchmarks/train_throughput.py --mode full --out "$OUT/train_throughput-$gpu.csv" 2>&1 | tail -20 \
      | tee "$OUT/train_throughput.txt" ;;
  profile)
    install
    $PY benchmarks/flex_profile.py --out "$OUT" "$@" 2>&1 | grep -v Warning | tail -40 ;;
  chapters)
    install
    POSENC_SIZE=${POSENC_SIZE:-full} POSENC_STATIC=1 $PY benchmarks/run_chapters.py --out "$OUT" "$@" ;;
  next)
    install
    timeout 220 $PY benchmarks/flex_profile.py --out "$OUT" --only "no score_mod" "ALiBi score_mod" "table read" \
      computed constant nothing 512-entry "float32 table" 2>&1 | grep -E "^n=|wrote|Error" || true
    POSENC_SIZE=small POSENC_STATIC=1 POSENC_PROGRESS=0 timeout 300 $PY benchmarks/run_chapters.py --out "$OUT" 07 \
      2>&1 | grep -v WARNING | tail -5 || true ;;
  *)
    echo "usage: bash benchmarks/on_gpu.sh tests [all] | bench [args] | profile [args] | chapters [prefix ...] | next" >&2; exit 2 ;;
esac
