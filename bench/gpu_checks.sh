#!/usr/bin/env bash
# Every GPU check of the project, in one run on a CUDA machine: the CUDA unit tests, notebooks 08 and 09
# with their `#| cuda` cells, and the mixed-precision benchmark. Writes logs to $OUT (default runs/gpu).
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
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -rs tests/test_fp16.py tests/test_cnn.py 2>&1 | tee "$out/tests.txt" || status=1
python3 -m pytest -q -p no:cacheprovider -rs tests/test_notebooks.py -k '08_cnn or 09_fp16' 2>&1 | tee "$out/notebooks.txt" || status=1
python3 bench/fp16_gpu.py 2>&1 | tee "$out/fp16_gpu.txt" || status=1
exit $status
