#!/usr/bin/env bash
# Stop the stack of a serve.yaml / --profile (default: the embedded one) after a crash: only the processes
# that carry its marker (POOLSERVE_STACK in their environment), never other Ray or vLLM processes.
set -u
cd "$(dirname "$0")/.."
[ -x .venv/bin/poolserve ] || exit 0
[ $# -gt 0 ] || set -- serve.yaml
exec .venv/bin/poolserve down "$@"
