#!/usr/bin/env bash
# Prints pip's configured sources and constraints (PIP_* variables first, then pip.conf's [install] and
# [global]) as `uv pip install` arguments: uv reads neither, and the Makefile installs with uv so that it
# takes the same packages from the same places as pip would. Usage: uv_args.sh <venv's pip>
set -euo pipefail
config=$("$1" config list 2>/dev/null || true)
conf() {  # `pip config get` misses keys that `list` shows (global.constraint here), so read the list
  local section
  for section in ':env:' install global; do
    value=$(sed -n "s/^$section\.$1='\(.*\)'\$/\1/p" <<<"$config" | head -1)
    [ -n "$value" ] && { echo "$value"; return; }
  done
  true
}
args=(--index-strategy unsafe-best-match)  # pip's rule: the best version across every index, not the first index's
index=$(conf index-url)
[ -n "$index" ] && args+=(--index-url "$index")
for url in $(conf extra-index-url); do args+=(--extra-index-url "$url"); done
for dir in $(conf find-links); do args+=(--find-links "$dir"); done
for file in $(conf constraint); do args+=(--constraint "$file"); done
echo "${args[@]}"
