#!/usr/bin/env bash
# One GPU session's measurements, in the order that keeps the most when device time runs out (docs/GPU.md):
# the H100 profile used end to end on one cold boot (answers, decode, ingest, squeeze, down), the stack
# against raw vLLM's server, then two more cold boots of the same profile compared with the first.
# Each bench writes its result into OUT as it goes. Run it detached from a copy of the checkout, which a
# later call's sync of the working tree cannot touch:
#   . scripts/gpu_env.sh; rm -rf /tmp/ck; cp -a . /tmp/ck; cd /tmp/ck
#   setsid nohup bash scripts/gpu_session.sh /tmp/out > /tmp/session.log 2>&1 < /dev/null &
set -u
out=${1:?the folder for results and logs}
profile=${PROFILE:-configs/h100.yaml}
bench_profile=${BENCH_PROFILE:-configs/gh200-bench.yaml}
mkdir -p "$out"
. scripts/gpu_env.sh
step() { echo "$(date -u +%H:%M:%S) $*" >> "$out/steps.log"; }
step "plan: $profile, one boot used"
python3 bench/bench_gpu_plan.py --profile "$profile" --out "$out" --squeeze --ingest --timeout 560 > "$out/plan.log" 2>&1
step "serving: $bench_profile, the stack then raw vLLM"
python3 bench/bench_gateway.py --profile "$bench_profile" --concurrency 1,4,16,64 --datasets random \
  --input-len 256 --output-len 128 --prompts 16 --name gpu-serving --out-dir "$out" > "$out/serving.log" 2>&1
step "boots: $profile, two more cold boots"
first=$(ls "$out"/gpu-plan-*.json | grep -v -- -boots.json | head -1)
python3 bench/bench_gpu_plan.py --profile "$profile" --out "$out" --no-use --boots 2 --timeout 560 \
  --with-boots "$first" > "$out/boots.log" 2>&1
step done
