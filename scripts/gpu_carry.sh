#!/usr/bin/env bash
# Fills .gpustage/ with what one transfer to an offline GPU machine carries, when a transfer holds at most
# 64 MiB with the checkout (17.5 MB on 2026-12-08) included: docs/GPU.md "Staging a GPU machine" says why and how.
#
#   bash scripts/gpu_carry.sh prepare BUNDLE_PARTS_DIR   # once: the bundle's parts (PART_MIB=40), the wheels
#   bash scripts/gpu_carry.sh N                          # before transfer N (0 to the last part): the paths to carry
#   bash scripts/gpu_carry.sh models                     # the embedder's fp16 copy: one transfer of its own
#   bash scripts/gpu_carry.sh caches                     # the kernel caches' parts, when they fit no bundle transfer
#   bash scripts/gpu_carry.sh mpnet                      # all-mpnet-base-v2's fp16 copy cut into transfers (.mpnetN/)
#
# Each transfer carries one part of ../shared/gpu's bundle (built with PART_MIB=40 so a part fits beside the
# checkout); the first also the chat models' configs and tokenizer, the last the stack's own wheels that neither
# the bundle nor the machine's image has (.whl/). On the machine each transfer runs
#   [ -d .gpustage ] && bash .gpustage/stage_and_install.sh .gpustage; . scripts/gpu_env.sh
# (the last part's also: pip install --no-index --no-deps --target /tmp/site2 .whl/*.whl). gpu_env.sh keeps what
# a transfer carried in /tmp and links the models back into every later checkout, so a run carries nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=.gpustage
PARTS=.gpuparts  # every part, kept here: never carried
LIMIT=$((64 * 1024 * 1024))  # what one transfer holds, the checkout included (the device tool's limit)
MPNET=models/gpu/all-mpnet-base-v2-fp16  # `make models-mpnet` writes it; 219 MB, so it travels in parts
MPNET_PART_BYTES=${MPNET_PART_BYTES:-44000000}  # a part beside the checkout (17.5 MB on 2026-12-08) stays under LIMIT
# The chat models' configs and tokenizer (3.5 MB), carried with the first part.
CHAT_MODEL_PATHS=(models/gpu/Qwen3.8-27B-dummy models/gpu/Qwen3.8-27B-4layer-dummy/config.json
                  models/gpu/Qwen3.8-27B-DSpark-dummy/config.json)
# The wheels a GPU machine needs beyond the bundle and its image (docs/GPU.md lists why each).
EXTRA_WHEELS=(faiss-cpu==1.15.1 inscriptis==2.7.6 argon2-cffi==25.1.0 argon2-cffi-bindings==26.2.0 cffi==2.1.1
              pycparser==3.12 limits==5.8.0 deprecated==3.0.1 pypdf==7.1.1 python-docx==1.2.0 python-pptx==1.0.2
              XlsxWriter==3.3.1)

# Bytes that travel with every transfer: tracked files and untracked ones git does not ignore.
checkout_bytes() {
  { git ls-files -z --cached --others --exclude-standard 2>/dev/null || true; } | xargs -0 -r stat -c %s 2>/dev/null |
    awk '{s += $1} END {print s + 0}' || true  # a tracked file deleted here counts nothing
}
bytes_of() { { find "$@" -type f -printf '%s\n' 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'; }
as_json() { printf '%s\n' "$@" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().split()))'; }

case "${1:-}" in
prepare)
  parts=${2:?the bundle parts folder, e.g. /tmp/bundle/parts}
  mkdir -p "$PARTS" "$STAGE" .whl
  cp "$parts"/part.* "$parts"/parts.sha256 "$parts"/bundle.sha256 "$parts"/stage_and_install.sh "$PARTS/"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${EXTRA_WHEELS[@]}"
  grep -qx '/.gpustage/' .git/info/exclude 2>/dev/null || printf '/.gpustage/\n/.gpuparts/\n/.whl/\n' >> .git/info/exclude
  ;;
[0-9]|[0-9][0-9])
  last=$(( $(wc -l < "$PARTS/parts.sha256") - 1 ))
  [ "$1" -le "$last" ] || { echo "the bundle has parts 0-$last" >&2; exit 2; }
  mkdir -p "$STAGE"
  rm -f "$STAGE"/part.*
  cp "$PARTS/part.$1" "$PARTS/parts.sha256" "$PARTS/bundle.sha256" "$PARTS/stage_and_install.sh" "$STAGE/"
  paths=("$STAGE")
  [ "$1" -eq 0 ] && paths+=("${CHAT_MODEL_PATHS[@]}")
  [ "$1" -eq "$last" ] && paths+=(.whl)
  checkout=$(checkout_bytes)
  total=$(( checkout + $(bytes_of "${paths[@]}") ))
  [ "$total" -le $LIMIT ] || { echo "transfer $1 would be $total bytes, over $LIMIT: build smaller parts" >&2; exit 2; }
  # The kernel caches an earlier session saved (scripts/gpu_cache.sh), one 8 MiB part beside each bundle part
  # where it fits (on the machine gpu_env.sh keeps it in /tmp/gpucache); the 17.5 MB
  # checkout of 2026-12-08 left no room beside a 40 MiB part, and then `caches` carries them on their own.
  if [ -d ".gpucache$1" ]; then
    if [ $(( total + $(bytes_of ".gpucache$1") )) -le $LIMIT ]; then
      paths+=(".gpucache$1")
    else
      echo "the cache part .gpucache$1 does not fit beside this part: carry the caches with \`$0 caches\`" >&2
    fi
  fi
  as_json "${paths[@]}"
  ;;
caches)
  shopt -s nullglob
  parts=(.gpucache[0-9]*)
  [ ${#parts[@]} -gt 0 ] || { echo "no .gpucacheN here (scripts/gpu_cache.sh save)" >&2; exit 2; }
  total=$(( $(checkout_bytes) + $(bytes_of "${parts[@]}") ))
  [ "$total" -le $LIMIT ] || { echo "the caches and the checkout are $total bytes, over $LIMIT" >&2; exit 2; }
  as_json "${parts[@]}"
  ;;
mpnet)
  # The model's small files and one sum in part 0, its weights cut in order; on the machine each transfer runs
  # mkdir -p /tmp/mpnet && cp .mpnetN/* /tmp/mpnet/, and gpu_env.sh joins them into $MPNET once all are there.
  [ -f "$MPNET/model.safetensors" ] || { echo "no $MPNET: make models-mpnet" >&2; exit 2; }
  rm -rf .mpnet[0-9]*
  mkdir -p .mpnet0
  tar -C "$MPNET" -cf .mpnet0/files.tar --exclude=model.safetensors .
  split -b $MPNET_PART_BYTES -d -a 1 "$MPNET/model.safetensors" .mpnet-weights.
  count=0
  for piece in .mpnet-weights.*; do
    mkdir -p ".mpnet$count" && mv "$piece" ".mpnet$count/model.safetensors.part$count"
    count=$((count + 1))
  done
  (cd "$MPNET" && sha256sum model.safetensors) > .mpnet0/model.sha256
  echo "$count" > .mpnet0/parts
  grep -qx '/.mpnet\*/' .git/info/exclude 2>/dev/null || echo '/.mpnet*/' >> .git/info/exclude
  for index in $(seq 0 $((count - 1))); do echo "[\".mpnet$index\"]"; done
  ;;
models)
  rm -f "$STAGE"/part.*
  echo '["models/gpu/all-MiniLM-L6-v2-fp16"]'
  ;;
*) sed -n 2,15p "$0"; exit 2 ;;
esac
