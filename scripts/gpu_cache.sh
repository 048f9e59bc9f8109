#!/usr/bin/env bash
# Triton's and torch.compile's kernel caches, carried from one GPU session to the next (docs/GPU.md "Staging a
# GPU machine"). A fresh machine compiles the 27B's GDN kernels (Triton, ~115 s) and vLLM's graphs
# (torch.compile, 36-66 s) again at every first start; both caches are keyed by the code, the model's shapes
# and the GPU's architecture (sm90: the H100 and the H200 share them), so a start on a warm copy skips both.
# vLLM 0.26 points TRITON_CACHE_DIR into its compile cache, one folder per model config, so that folder holds
# the GDN kernels too (the H100, 2026-12-07: ~/.triton/cache had one kernel).
#
#   bash scripts/gpu_cache.sh save DIR   # on the GPU machine, at the end: the caches as parts of 8 MiB in DIR
#   bash scripts/gpu_cache.sh load DIR   # on the GPU machine, before a start: unpack what DIR holds, if whole
#
# `save`'s parts come back under $OUT (at most 8 files a call). A transfer has room for one 8 MiB part beside a
# bundle part and the checkout, so the next session carries one part with each staging transfer, gathers them in
# /tmp/gpucache on the machine, and loads them once all are there; an incomplete or damaged set unpacks nothing
# (the start is then cold, never half-warm). docs/GPU.md "Staging a GPU machine" has the commands.
set -uo pipefail
dir=${2:?a folder}
root=${GPU_CACHE_ROOT:-/}  # another root only for tests/unit/scripts/test_gpu_cache.py
caches=(root/.triton/cache root/.cache/vllm/torch_compile_cache tmp/torchinductor_root)
case "${1:-}" in
save)
  mkdir -p "$dir"
  present=()
  for c in "${caches[@]}"; do [ -d "$root/$c" ] && present+=("$c"); done
  [ ${#present[@]} -gt 0 ] || { echo "no cache to save"; exit 0; }
  tar -C "$root" -czf - "${present[@]}" | split -b 8M -d -a 1 - "$dir/gpucache.tgz.part"
  (cd "$dir" && sha256sum gpucache.tgz.part* > gpucache.sha256)
  du -ch "$dir"/gpucache.tgz.part* | tail -1
  ;;
load)
  [ -f "$dir/gpucache.sha256" ] || { echo "no carried cache in $dir"; exit 0; }
  if (cd "$dir" && sha256sum --quiet -c gpucache.sha256); then
    cat "$dir"/gpucache.tgz.part* | tar -C "$root" -xzf - && echo "caches unpacked: ${caches[*]}"
  else
    echo "the carried cache is incomplete or damaged: starting cold"
    exit 3  # gpu_env.sh tries again once more parts are there
  fi
  ;;
*) echo "usage: $0 save|load DIR" >&2; exit 2 ;;
esac
