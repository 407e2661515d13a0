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
python -m pip install --quiet "deepspeed==$deepspeed_version" -e ".[test]" || exit 2
python - <<'PY' || exit 2
import torch
assert torch.cuda.is_available(), "torch does not see CUDA after the install"
print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
PY

export DS_ACCELERATOR=cuda
mkdir -p reports
common=(--pyargs pytest_zero3.conformance -n 0 --zero3-backend=auto "--zero3-world-size=$gpus" -p no:cacheprovider)
python -m pytest "${common[@]}" --zero3-impl=reference \
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
expect="conformance/expectations/deepspeed-$deepspeed_version.toml"
python -m pytest "${common[@]}" --zero3-impl=installed --zero3-expect="$expect" \
    --zero3-report=reports/gpu-installed.json --zero3-report-md=reports/gpu-installed.md "$@"
installed=$?
# 003-g and its known-bad host-timer controller (skipped, with the reason, on fewer than 2 GPUs)
python -m pytest tests/test_flags_003g.py -p no:cacheprovider -rs "$@"
timing=$?
# the GPU-only profiles (qgz needs ranks on several nodes to quantize anything: on one node it tests
# the fallback to reduce-scatter only)
python -m pytest "${common[@]}" --zero3-impl=reference --zero3-profile=fp16,qwz,qgz,deepcompile \
    --zero3-report=reports/gpu-profiles.json --zero3-report-md=reports/gpu-profiles.md "$@"
profiles=$?
# the rule family with the GPU-only ZeRO keys in its draw
PYTEST_ZERO3_GPU_KEYS=1 python -m pytest "${common[@]}" --zero3-impl=reference --zero3-select=rule \
    "--zero3-examples=${RULE_EXAMPLES:-24}" --zero3-report=reports/gpu-keys.json --zero3-report-md=reports/gpu-keys.md "$@"
keys=$?
echo "gpu-check: $gpus GPU(s); reference exit $reference, installed exit $installed, 003-g timing tests exit $timing," \
     "GPU-only profiles exit $profiles, rule family with GPU-only keys exit $keys; reports in reports/gpu-*"
exit $(( reference || installed || timing || profiles || keys ))
