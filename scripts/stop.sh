#!/usr/bin/env bash
# Stop the local Ray instance and everything it started. vLLM's EngineCore and Worker
# processes can outlive `serve run` in other process groups, so they are killed by name too.
set -u
VENV_BIN="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
RAY="$VENV_BIN/ray"; [ -x "$RAY" ] || RAY=ray
"$RAY" stop --force >/dev/null 2>&1 || true
for _ in $(seq 1 30); do
  pids=$(pgrep -f -u "$(id -u)" 'VLLM::|ray::|raylet|gcs_server|EngineCore|serve run' || true)
  [ -z "$pids" ] && exit 0
  kill -TERM $pids 2>/dev/null || true
  sleep 1
done
pids=$(pgrep -f -u "$(id -u)" 'VLLM::|ray::|raylet|gcs_server|EngineCore|serve run' || true)
[ -n "$pids" ] && kill -KILL $pids 2>/dev/null
exit 0
