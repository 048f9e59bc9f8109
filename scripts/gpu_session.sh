#!/usr/bin/env bash
# One GPU session's measurements, each a step that writes its result into OUT as it goes (docs/GPU.md).
# STEPS picks them, in order (the first ones keep the most when device time runs out); the default is the
# whole first-session order:
#   plan      the H100 profile used end to end on one cold boot (answers, decode, ingest, squeeze, down)
#   serving   the stack against raw vLLM's server (gh200-bench), Ray Serve's stream batching as planned
#   boots     two more cold boots of the H100 profile, compared with the first
#   decode    raw vLLM's single-stream decode under each compilation mode (bench/gpu_decode_modes.py)
#   ingest    one cold boot of the H100 profile: answers, then the ingest against raw sentence-transformers
#   serving0  as serving, with chat.stream_batching_interval_ms 0 (every token its own chunk)
#   direct    as serving0, with gateway.direct_ingress (no proxy hop): the H200's table of 2026-12-06
#   bench     one cold boot of the bench profile (compiled, no drafter): answers, decode, the ingest by part
#   ondemand  model swaps through the stack (bench/bench_on_demand.py --swaps 20): two on-demand engines of
#             PROFILE_ON_DEMAND (default configs/gpu-on-demand.yaml; configs/h100-on-demand.yaml for two 27Bs), one
#             awake at a time; ON_DEMAND_CYCLES=N adds N sleep/wake cycles of one engine (endurance), and
#             ON_DEMAND_SWAPS=2 leaves the device time to them (1.39 s a cycle on the H100, 2026-12-07)
# Run it detached from a copy of the checkout, which a later call's sync of the working tree cannot touch:
#   . scripts/gpu_env.sh; rm -rf /tmp/ck; cp -a . /tmp/ck; cd /tmp/ck
#   STEPS="decode ingest" setsid nohup bash scripts/gpu_session.sh /tmp/out > /tmp/session.log 2>&1 < /dev/null &
set -u
out=${1:?the folder for results and logs}
profile=${PROFILE:-configs/h100.yaml}
bench_profile=${BENCH_PROFILE:-configs/gh200-bench.yaml}
on_demand_profile=${PROFILE_ON_DEMAND:-configs/gpu-on-demand.yaml}
steps=${STEPS:-plan serving boots}
mkdir -p "$out"
. scripts/gpu_env.sh
step() { echo "$(date -u +%H:%M:%S) $*" >> "$out/steps.log"; }
serving() {  # $1: the result's name; the rest: bench_gateway's extra arguments
  local name=$1; shift
  python3 bench/bench_gateway.py --profile "$bench_profile" --concurrency 1,4,16,64 --datasets random \
    --input-len 256 --output-len 128 --prompts 16 --name "$name" --out-dir "$out" "$@" > "$out/$name.log" 2>&1
}
for name in $steps; do
  step "$name: start"
  case $name in
    plan) python3 bench/bench_gpu_plan.py --profile "$profile" --out "$out" --squeeze --ingest --timeout 560 \
            > "$out/plan.log" 2>&1 ;;
    serving) serving gpu-serving ;;
    boots) first=$(ls "$out"/gpu-plan-*.json | grep -v -- -boots.json | head -1)
           python3 bench/bench_gpu_plan.py --profile "$profile" --out "$out" --no-use --boots 2 --timeout 560 \
             --with-boots "$first" > "$out/boots.log" 2>&1 ;;
    decode) python3 bench/gpu_decode_modes.py --profile "$bench_profile" --out "$out" --start-timeout 540 \
              --modes "${DECODE_MODES:-planned,compiled-full-decode-only,compiled-full-and-piecewise}" \
              > "$out/decode.log" 2>&1 ;;
    ingest) mkdir -p "$out/ingest"
            python3 bench/bench_gpu_plan.py --profile "$profile" --out "$out/ingest" --ingest --timeout 560 \
              > "$out/ingest.log" 2>&1 ;;
    bench) mkdir -p "$out/bench"
           python3 bench/bench_gpu_plan.py --profile "$bench_profile" --out "$out/bench" --ingest --timeout 560 \
             > "$out/bench.log" 2>&1 ;;
    serving0) serving gpu-serving-interval0 --chat stream_batching_interval_ms=0 ;;
    direct) serving gpu-serving-direct --chat stream_batching_interval_ms=0 --gateway direct_ingress=true ;;
    ondemand) mkdir -p "$out/ondemand"
              python3 bench/bench_on_demand.py --profile "$on_demand_profile" --out "$out/ondemand" --swaps "${ON_DEMAND_SWAPS:-20}" \
                --cycles "${ON_DEMAND_CYCLES:-0}" --timeout 560 > "$out/ondemand.log" 2>&1 ;;
    *) step "$name: no such step" ;;
  esac
  step "$name: done ($?)"
done
step done
