#!/usr/bin/env bash
# Check the Jetson profile's CUDA path on a machine with an NVIDIA GPU and a CUDA build of torch
# (CI has neither; docs/architecture.md, "The edge agent", CUDA). Runs, writing each log to OUT_DIR:
#   1. the CUDA tests (tests/unit/edge_agent/test_cuda_rounds.py: every algorithm, DP on and off,
#      GPU against CPU) and the device-profile tests, none skipped;
#   2. bench/device_rounds.py (one local round, CPU against CUDA);
#   3. three short demos (embedded broker, coordinator, agents): FedAvg on a jetson/rpi/phone fleet,
#      SCAFFOLD on jetsons under DP-SGD, FedProto on a mixed fleet; each jetson agent must log
#      that it trained on cuda.
# Usage: scripts/cuda-check.sh [OUT_DIR]   (QUICK=1 for the bench's quick mode)
# Expects the project's packages importable (pip install -e '.[demo]' with a CUDA torch).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/cuda-check}
mkdir -p "$out"
failed=()

python3 -c 'import sys, torch; ok = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda,
"device", torch.cuda.get_device_name(0) if ok else None); sys.exit(0 if ok else 1)' || {
    echo "no CUDA device visible to torch: nothing to check"; exit 2; }

python3 -m pytest -q -p no:cacheprovider -rs tests/unit/edge_agent/test_cuda_rounds.py \
    tests/unit/edge_agent/test_device_profiles.py 2>&1 | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=(tests)
if grep -q "SKIPPED" "$out/tests.log"; then failed+=("tests skipped"); fi

python3 bench/device_rounds.py ${QUICK:+--quick} 2>&1 | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=(bench)

# Each demo's jetson agents must say they train on cuda ("... family cnn_large on cuda ...").
demo() {
    local name=$1; shift
    python3 -m launcher --out "$out/$name" "$@" > "$out/$name.log" 2>&1 || failed+=("$name")
    tail -25 "$out/$name.log"
    local jetsons on_cuda
    jetsons=$(ls -d "$out/$name"/agents/jetson-* 2>/dev/null | wc -l)
    on_cuda=$(grep -l "device jetson, family .* on cuda" "$out/$name"/agents/jetson-*/agent.log 2>/dev/null | wc -l)
    echo "$name: $on_cuda of $jetsons jetson agents trained on cuda"
    [ "$jetsons" -gt 0 ] && [ "$on_cuda" -eq "$jetsons" ] || failed+=("$name: jetson agents not on cuda")
}
demo demo --agents 6 --rounds 5 --min-accuracy 0.7
demo scaffold-dp --agents 3 --devices jetson --rounds 3 --algorithm scaffold --dp-epsilon 8
demo fedproto --agents 3 --devices jetson,rpi,phone --rounds 3 --algorithm fedproto

if [ ${#failed[@]} -gt 0 ]; then echo "CUDA check FAILED: ${failed[*]}"; exit 1; fi
echo "CUDA check passed"
