#!/usr/bin/env bash
# Fills .gpustage/ with what one transfer to an offline GPU machine carries, when a transfer holds at most
# 64 MiB with the checkout (about 14 MiB) included: docs/GPU.md "Staging a GPU machine" says why and how.
#
#   bash scripts/gpu_carry.sh prepare BUNDLE_PARTS_DIR   # once: the bundle's parts (PART_MIB=40), the wheels
#   bash scripts/gpu_carry.sh N                          # before transfer N (0 to the last part): the paths to carry
#   bash scripts/gpu_carry.sh run                        # before every later call: the models a run needs
#
# Each transfer carries one part of ../shared/gpu's bundle (built with PART_MIB=40 so a part fits beside the
# checkout: with 50 MiB parts the checkout of 2026-12-07 no longer did); the last part also the stack's own
# wheels that neither the bundle nor the machine's image has (.whl/) and the chat models' configs and tokenizer;
# `run` the fp16 embedder. On the machine each runs
#   bash .gpustage/stage_and_install.sh .gpustage && . scripts/gpu_env.sh
# (the last part's transfer also: pip install --no-index --no-deps --target /tmp/site2 .whl/*.whl). What is
# installed stays in /tmp while the machine is held; an ignored folder of the checkout stays too, but only while
# the same machine is held: every run names the models again (`run`).
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=.gpustage
PARTS=.gpuparts  # every part, kept here: never carried
# The chat models' configs and tokenizer, carried with the last part and with every later run.
CHAT_MODELS='"models/gpu/Qwen3.8-27B-dummy", "models/gpu/Qwen3.8-27B-4layer-dummy/config.json", "models/gpu/Qwen3.8-27B-DSpark-dummy/config.json"'
# The wheels a GPU machine needs beyond the bundle and its image (docs/GPU.md lists why each).
EXTRA_WHEELS=(faiss-cpu==1.15.1 inscriptis==2.7.6 argon2-cffi==25.1.0 argon2-cffi-bindings==26.2.0 cffi==2.1.1
              pycparser==3.12 limits==5.8.0 deprecated==3.0.1 pypdf==7.1.1 python-docx==1.2.0 python-pptx==1.0.2
              XlsxWriter==3.3.1)

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
  if [ "$1" -lt "$last" ]; then
    carry='".gpustage"'
  else
    carry="\".gpustage\", \".whl\", $CHAT_MODELS"
  fi
  # The kernel caches an earlier session saved (scripts/gpu_cache.sh), one 8 MiB part beside each bundle part;
  # on the machine: mkdir -p /tmp/gpucache && cp .gpucacheN/* /tmp/gpucache/
  if [ -d ".gpucache$1" ]; then
    carry="$carry, \".gpucache$1\""
  fi
  echo "[$carry]"
  ;;
run)
  rm -f "$STAGE"/part.*
  echo "[\"models/gpu/all-MiniLM-L6-v2-fp16\", $CHAT_MODELS]"
  ;;
*) sed -n 2,15p "$0"; exit 2 ;;
esac
