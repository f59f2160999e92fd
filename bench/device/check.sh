#!/usr/bin/env bash
# The GPU check, as one command on the device machine (~9.5 minutes: the host-bound rows fill
# what the rest leaves of 560 s):
#     bash bench/device/wheels.sh                      # here, first
#     device run: command "bash bench/device/check.sh", carry [".whl"], timeout_s 600
# It installs the carried wheels into /tmp/site, then runs, each with its own time limit and its
# output under $OUT: the transformers and Lightning examples with and without trainvigil on the GPU,
# watch()'s overhead on a CUDA step, log()'s cost beside its peers, and, in the time left, the host-bound
# rows (the agent beside a GIL-bound step on a shared core and on two).
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
# Measured on an H200: transformers ~32 s and Lightning ~40 s a pair (fresh processes: the imports
# and CUDA's start dominate), torch_overhead and agent_overhead well inside their limits. The integrations,
# the figures that matter most, run first; the host-bound rows (whose step moved 3.4-6.3 ms between rows on that
# machine) get what is left of 560 s.
run integrations 400 python3 integrations_overhead.py --only transformers --only lightning --repeats 5
run torch_overhead 90 python3 torch_overhead.py --device cuda
# log() beside its peers on a machine quieter than the 2-core VMs (W&B and MLflow are not there: rows say so)
run agent_overhead 45 python3 agent_overhead.py --peer-steps 1000 --check
left=$((560 - SECONDS))
if ((left > 40)); then
    run host_bound "$left" python3 host_bound_overhead.py --only 1 --only 4 --pairs 6
fi
