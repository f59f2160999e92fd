#!/usr/bin/env bash
# Issue 20's GPU check, as one command on the device machine (about 7 minutes on an H100):
#     bash bench/device/wheels.sh                      # here, first
#     device run: command "bash bench/device/check.sh", carry [".whl"], timeout_s 600
# It installs the carried wheels into /tmp/site, then runs, each with its own time limit and its
# output under $OUT: the host-bound rows (the agent beside a GIL-bound step on a shared core and on
# two; the two reference threads without trainvigil), the transformers and Lightning examples with
# and without trainvigil on the GPU, watch()'s overhead on a CUDA step, and log()'s cost beside its peers.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
{
    nvidia-smi -L
    nproc
    python3 -c "import torch, transformers, lightning; print('torch', torch.__version__, torch.cuda.get_device_name(0),
'transformers', transformers.__version__, 'lightning', lightning.__version__)"
    python3 -c "import trainvigil, trainvigil.daemon.cli, duckdb, nats, msgspec; print('trainvigil imports')"
    command -v nats-server
} 2>&1 | tee "$OUT/machine.txt" || exit 1
cd bench
run() {  # name, seconds, command...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($limit s at most)"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
    echo "== $name: exit ${PIPESTATUS[0]}"
}
run host_bound 140 python3 host_bound_overhead.py --only 1 --only 4 --only 5 --only 6 --pairs 8
run integrations 280 python3 integrations_overhead.py --only transformers --only lightning --repeats 5
run torch_overhead 120 python3 torch_overhead.py --device cuda
# log() beside its peers on a machine quieter than the 2-core VMs (W&B and MLflow are not there: rows say so)
run agent_overhead 50 python3 agent_overhead.py --peer-steps 1000 --check
