#!/usr/bin/env bash
# `make serve`: plan, start Ray as the plan sizes it, run the app in the foreground.
# Ctrl-C (or any exit) tears the whole tree down, vLLM's engine processes included.
set -u
cd "$(dirname "$0")/.."
CONFIG="${1:-serve.yaml}"
BIN=.venv/bin
export RAY_USAGE_STATS_ENABLED=0
# A profile that does not fit its pool is refused here, with sized advice, before anything starts.
RAY_ARGS=$("$BIN/poolserve" ray-start-args "$CONFIG") || exit 2
cleanup() { trap - EXIT INT TERM; bash scripts/stop.sh; }
trap cleanup EXIT INT TERM
# Ray's object store and dashboard come from the plan, not Ray's defaults (30% of RAM, dashboard on).
if ! "$BIN/ray" start --head $RAY_ARGS >/dev/null; then
  echo "ray start failed; if a previous stack is still running, 'make stop' ends it" >&2
  trap - EXIT INT TERM
  exit 1
fi
# In the foreground, so Ctrl-C reaches `serve run` and it shuts the app down before cleanup.
"$BIN/serve" run --address auto "$CONFIG"
