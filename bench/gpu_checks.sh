#!/usr/bin/env bash
# Every GPU check of the project, in one run on a CUDA machine: first the mixed-precision benchmark (with TFLOP/s,
# and its torch.compile run) alone on the GPU, so nothing else shares it while it is timed; then, side by side,
# the CUDA unit tests, notebooks 08, 08a, 08b, 09 and 12 with their `#| cuda` cells, the trainer with
# --fp16 auto, alone and under torchrun (NCCL), and, where the host has 8 cores or more, the training loop's CPU
# overhead (bench_overhead.py --fused, three processes each pinned to a core of its own: the host's CPU is another
# than CI's); last, alone, the ResNet recipe on Fashion-MNIST in fp32, fp16, bf16 and with torch.amp. Writes logs to
# $OUT (default runs/gpu); exits 1 if any part failed.
# A machine without this project's dependencies can get them as wheels in .whl/ (see README).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} MPLBACKEND=Agg PYTHONUNBUFFERED=1 EXP_DATA=${EXP_DATA:-/tmp/exp-data}
status=0
TIMEFORMAT='wall %R s'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"
python3 bench/fp16_gpu.py 2>&1 | tee "$out/fp16_gpu.txt" || status=1

# the trainer on the GPU: --fp16 auto must pick fp16 there; then the same under torchrun (NCCL, one process per GPU)
train_checks() {
  local s=0 gpus
  gpus=$(nvidia-smi -L | wc -l)
  echo "# python -m exp.train --epochs 3 --fp16 auto"
  time python3 -m exp.train --epochs 3 --fp16 auto --out "$out/run-single" || s=1
  echo "# torchrun --standalone --nproc_per_node $gpus -m exp.train --epochs 3 --fp16 auto"
  time python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus" \
    -m exp.train --epochs 3 --fp16 auto --out "$out/run-torchrun" || s=1
  grep -H '"fp16"' "$out"/run-*/config.json
  rm -rf "$out"/run-*
  return $s
}
# the checks, side by side (pytest-xdist spreads the tests over processes; the suite is written for that), with
# two torch threads each, so that a dozen processes do not each start one thread per core
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
pids=()
python3 -m pytest -q -p no:cacheprovider -rs -n 4 tests/test_fp16.py tests/test_cnn.py tests/test_batchnorm.py \
  tests/test_distributed.py >"$out/tests.txt" 2>&1 & pids+=($!)
python3 -m pytest -q -p no:cacheprovider -rs tests/test_learner.py -k 'on_a_gpu' >"$out/tests_learner.txt" 2>&1 & pids+=($!)
python3 -m pytest -q -p no:cacheprovider -rs -n 5 tests/test_notebooks.py \
  -k '08_cnn or 08a_hooks_init or 08b_batchnorm or 09_fp16 or 12_distributed' >"$out/notebooks.txt" 2>&1 & pids+=($!)
(train_checks 2>&1 | grep -v '^W[0-9]' >"$out/train.txt") & pids+=($!)
logs=(tests tests_learner notebooks train)
cores=$(nproc)
if [ "$cores" -ge 8 ] && command -v taskset >/dev/null; then
  for i in 1 2 3; do  # the last three cores; one torch thread each (the script sets it)
    taskset -c $((cores - i)) python3 bench/bench_overhead.py --no-peers --no-cnn --fused --rounds 60 \
      >"$out/overhead-$i.txt" 2>&1 & pids+=($!)
    logs+=("overhead-$i")
  done
fi
for p in "${pids[@]}"; do wait "$p" || status=1; done
for f in "${logs[@]}"; do echo "== $f"; tail -n 25 "$out/$f.txt"; done

# last, alone on the GPU so that its times mean something: lesson 13's ResNet with the trainer's recipe, 5 epochs on
# Fashion-MNIST, in fp32, with our mixed precision (fp16, dynamic loss scaling), the same in channels_last (which
# tensor cores prefer), in bf16, and with torch.amp (autocast to fp16 and a GradScaler, bench/amp_resnet.py): time
# and test accuracy.
# The machine may have no network: $FASHION names a folder holding Fashion-MNIST's four IDX files (else the
# trainer downloads them).
resnet_checks() {
  local s=0 data=${FASHION:-fashion}
  local i=0 options
  for options in "--fp16 off" "--fp16 on" "--fp16 on --channels-last" "--fp16 bf16"; do
    echo "# python -m exp.train --data $data --arch resnet --epochs 5 $options"
    i=$((i + 1))
    # shellcheck disable=SC2086  # the options split into words
    { time python3 -m exp.train --data "$data" --arch resnet --epochs 5 $options \
      --out "$out/resnet-$i" | tail -n 2; } || s=1
  done
  echo "# python bench/amp_resnet.py --data $data --arch resnet --epochs 5"
  { time python3 bench/amp_resnet.py --data "$data" --arch resnet --epochs 5 | tail -n 2; } || s=1
  rm -rf "$out"/resnet-*
  return $s
}
resnet_checks >"$out/resnet.txt" 2>&1 || status=1
echo "== resnet"; cat "$out/resnet.txt"
exit $status
