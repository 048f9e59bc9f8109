#!/usr/bin/env bash
# `make serve`: plan (a profile that does not fit is refused here, with sized advice), start a
# private Ray head (loopback only, token auth, its own ports and temp dir), run the app in the
# foreground. Ctrl-C or SIGTERM ends this stack's processes, vLLM's engine included, and no others.
set -u
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- serve.yaml
exec .venv/bin/poolserve up "$@"
