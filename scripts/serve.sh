#!/usr/bin/env bash
# `make serve`: run the stack in the foreground; Ctrl-C (or any exit) tears the whole tree down.
set -u
cd "$(dirname "$0")/.."
CONFIG="${1:-serve.yaml}"
# Keep Ray's own footprint small: no dashboard, no usage reporting.
export RAY_USAGE_STATS_ENABLED=0 RAY_SERVE_LLM_ENABLE_USAGE_TELEMETRY=0
cleanup() { bash scripts/stop.sh; }
trap cleanup EXIT INT TERM
.venv/bin/serve run "$CONFIG" &
wait $!
