#!/usr/bin/env bash
# GPU readiness: one command on a machine with CUDA GPUs (not run in CI, which has none).
#
#   bash scripts/gpu-check.sh [extra pytest args...]
#
# 1. Installs the CUDA build of the pinned torch (the version scripts/install.sh pins), unless the
#    installed torch already sees CUDA; then deepspeed and this package as scripts/install.sh does.
#    TORCH_CUDA_INDEX=URL picks the wheel index; by default the newest CUDA index that has the version.
# 2. Runs the conformance suite with DS_ACCELERATOR=cuda and --zero3-backend=auto (the backend of
#    DeepSpeed's CUDA accelerator, through pytest_zero3/accel.py) at world size = GPU count (one GPU:
#    world size 1, where the contracts that need two ranks report "unsupported"), against the
#    reference and against the installed deepspeed with its expectations file; JSON and Markdown
#    reports go to reports/gpu-{reference,installed}.{json,md}.  The reference's report must say that
#    the ranks ran on the cuda accelerator with nccl (else the adapter did not reach the device).
# 3. Exercises the CUDA-event timing path of the adaptive prefetch controller: contract 003-g (every
#    all-gather delayed on the device) must pass on the reference and flag a controller that times
#    waits with host timers (tests/test_flags_003g.py; needs 2 GPUs).
# 4. Runs the GPU-only config profiles (fixtures/profiles.py: fp16, qwz, qgz, deepcompile; CPU runs
#    report them unsupported) against the reference: reports/gpu-profiles.{json,md}.
# 5. Runs the rule family with the ZeRO keys a CPU cannot draw drawn too (PYTEST_ZERO3_GPU_KEYS=1;
#    fixtures/rule/zero_keys.py: zero_quantized_weights, zero_quantized_nontrainable_weights,
#    zero_quantized_gradients), RULE_EXAMPLES drawn examples (default 24) against the reference:
#    reports/gpu-keys.{json,md}.
# Environment: GPU_CHECK_WHEELS=DIR installs deepspeed and its missing needs from wheels in DIR, offline
# (a machine with no package index; build DeepSpeed's wheel elsewhere with `pip wheel --no-deps
# deepspeed==VERSION`: it is pure Python, its ops JIT-built where they run); GPU_CHECK_WORKERS=N runs
# N worlds side by side (default 0: serially; a world of one GPU's size shares it well with others);
# GPU_CHECK_STEP_S=S stops any one step after S seconds (default: none), so a slow step leaves the
# next ones their time. Each step's output is also kept in reports/gpu-STEP.log.
# Steps run in this order: the reference (2), the GPU-only profiles (4), the installed deepspeed (2),
# 003-g (3), the GPU-only keys (5).
# Exit status: non-zero when any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -lt 1 ]; then
    echo "gpu-check: no CUDA GPU visible (nvidia-smi -L lists none); run this on a machine with GPUs" >&2
    exit 2
fi
torch_version=$(grep -o 'torch==[0-9][0-9.]*' scripts/install.sh | head -1 | cut -d= -f3)
deepspeed_version=$(grep -o 'deepspeed==[0-9][0-9.]*' scripts/install.sh | head -1 | cut -d= -f3)

if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    installed=""
    for index in ${TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu130 https://download.pytorch.org/whl/cu129 \
                 https://download.pytorch.org/whl/cu128 https://download.pytorch.org/whl/cu126}; do
        echo "gpu-check: installing torch==$torch_version from $index"
        if python -m pip install --quiet --force-reinstall "torch==$torch_version" --index-url "$index"; then
            installed="$index"
            break
        fi
    done
    if [ -z "$installed" ]; then
        echo "gpu-check: no CUDA wheel of torch==$torch_version found; set TORCH_CUDA_INDEX to a wheel index" >&2
        exit 2
    fi
fi
# deepspeed at the pinned version and this package, unless both are there already
if ! python -c "import sys, importlib.metadata as m, pytest_zero3; sys.exit(m.version('deepspeed') != '$deepspeed_version')" 2>/dev/null; then
    if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
        python -m pip install --quiet --no-index --no-deps "$GPU_CHECK_WHEELS"/*.whl || exit 2
        python -m pip install --quiet --no-index --no-deps --no-build-isolation -e . || exit 2
    else
        python -m pip install --quiet "deepspeed==$deepspeed_version" -e ".[test]" || exit 2
    fi
fi
python - <<'PY' || exit 2
import torch
assert torch.cuda.is_available(), "torch does not see CUDA after the install"
print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
PY

export DS_ACCELERATOR=cuda
mkdir -p reports
# DeepSpeed's JIT-built ops (FusedAdam for 008-c's config, DeepSpeedCPUAdam for the offload profile)
# are built once here, outside any scenario's timeout, into the directory the suite's ranks use.
SECONDS=0
python -c "from pytest_zero3 import impl; impl.prepare_process(impl.parse('installed'))
import pytest_zero3.fixtures.fused_adam_build, pytest_zero3.fixtures.cpu_adam_op" 2>&1 | tail -3
echo "gpu-check: DeepSpeed's ops built in $SECONDS s"

workers=()
if [ "${GPU_CHECK_WORKERS:-0}" != 0 ]; then
    workers=(-n "$GPU_CHECK_WORKERS" --dist loadgroup)
else
    workers=(-n 0)
fi
# one step: its name, then its command; time-boxed when GPU_CHECK_STEP_S is set; output kept
step() {
    local name=$1
    shift
    local box=()
    if [ -n "${GPU_CHECK_STEP_S:-}" ]; then
        box=(timeout --signal=INT --kill-after=20 "$GPU_CHECK_STEP_S")
    fi
    SECONDS=0
    "${box[@]}" "$@" 2>&1 | tee "reports/gpu-$name.log"
    local rc=${PIPESTATUS[0]}
    echo "gpu-check: step $name exit $rc in $SECONDS s"
    return "$rc"
}
common=(--pyargs pytest_zero3.conformance "${workers[@]}" --zero3-backend=auto "--zero3-world-size=$gpus" -p no:cacheprovider)
step reference python -m pytest "${common[@]}" --zero3-impl=reference \
    --zero3-report=reports/gpu-reference.json --zero3-report-md=reports/gpu-reference.md "$@"
reference=$?
# auto went through DeepSpeed's accelerator: the ranks say what they ran on
python - <<'PY' || reference=1
import json
info = json.load(open("reports/gpu-reference.json"))["implementation"]
ran = (info.get("accelerator"), info.get("backend"))
assert ran == ("cuda", "nccl"), f"gpu-check: the ranks ran on {ran}, not (cuda, nccl): see pytest_zero3/accel.py"
print(f"gpu-check: ranks ran on the {ran[0]} accelerator with {ran[1]}, {info.get('device_count')} device(s) on the node")
PY
# the GPU-only profiles (qgz needs ranks on several nodes to quantize anything: on one node it tests
# the fallback to reduce-scatter only)
step profiles python -m pytest "${common[@]}" --zero3-impl=reference --zero3-profile=fp16,qwz,qgz,deepcompile \
    --zero3-report=reports/gpu-profiles.json --zero3-report-md=reports/gpu-profiles.md "$@"
profiles=$?
expect="conformance/expectations/deepspeed-$deepspeed_version.toml"
step installed python -m pytest "${common[@]}" --zero3-impl=installed --zero3-expect="$expect" \
    --zero3-report=reports/gpu-installed.json --zero3-report-md=reports/gpu-installed.md "$@"
installed=$?
# 003-g and its known-bad host-timer controller (skipped, with the reason, on fewer than 2 GPUs)
step timing python -m pytest tests/test_flags_003g.py -p no:cacheprovider -rs "$@"
timing=$?
# the rule family with the GPU-only ZeRO keys in its draw
PYTEST_ZERO3_GPU_KEYS=1 step keys python -m pytest "${common[@]}" --zero3-impl=reference --zero3-select=rule \
    "--zero3-examples=${RULE_EXAMPLES:-24}" --zero3-report=reports/gpu-keys.json --zero3-report-md=reports/gpu-keys.md "$@"
keys=$?
echo "gpu-check: $gpus GPU(s); reference exit $reference, installed exit $installed, 003-g timing tests exit $timing," \
     "GPU-only profiles exit $profiles, rule family with GPU-only keys exit $keys; reports in reports/gpu-*"
exit $(( reference || installed || timing || profiles || keys ))
