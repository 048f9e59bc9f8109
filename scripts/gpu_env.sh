# Sourced on the GPU machine (`. scripts/gpu_env.sh`, docs/GPU.md): the offline bundle (/tmp/site), the stack's extra wheels (/tmp/site2), this checkout.
export PYTHONPATH=/tmp/site:/tmp/site2:$PWD PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
# What staging transfers carry (scripts/gpu_carry.sh) is kept in one folder of the machine: an ignored folder of
# the checkout is gone at the next call, /tmp stays while the machine is held. The models are linked back into
# every later checkout, so a run's transfer carries the checkout alone.
stash=${GPU_STASH:-/tmp}  # another folder only for tests/unit/scripts/test_gpu_carry.py
mkdir -p "$stash/gpumodels" models/gpu
for d in models/gpu/*; do [ -d "$d" ] && [ ! -L "$d" ] && cp -a "$d" "$stash/gpumodels/"; done
for d in "$stash"/gpumodels/*; do [ -e "$d" ] && [ ! -e "models/gpu/${d##*/}" ] && ln -s "$d" "models/gpu/${d##*/}"; done
for d in .gpucache[0-9]*; do [ -d "$d" ] && mkdir -p "$stash/gpucache" && cp "$d"/* "$stash/gpucache/"; done
for d in .mpnet[0-9]*; do [ -d "$d" ] && mkdir -p "$stash/mpnet" && cp "$d"/* "$stash/mpnet/"; done
for d in Qwen3.8-27B-4layer-dummy Qwen3.8-27B-DSpark-dummy; do
  [ -d models/gpu/$d ] && for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
    [ -f models/gpu/$d/$f ] || cp models/gpu/Qwen3.8-27B-dummy/$f models/gpu/$d/ 2>/dev/null; done
done
# Kernel caches carried from an earlier GPU session in parts (scripts/gpu_cache.sh), unpacked once per machine.
if [ -f "$stash/gpucache/gpucache.sha256" ] && [ ! -e "$stash/.gpucache-loaded" ]; then
  bash scripts/gpu_cache.sh load "$stash/gpucache" && touch "$stash/.gpucache-loaded"
fi
# all-mpnet-base-v2's fp16 copy carried in parts (scripts/gpu_carry.sh mpnet), joined once all are there and its
# sum matches (an incomplete or damaged set leaves no model behind).
mpnet=$stash/gpumodels/all-mpnet-base-v2-fp16
if [ -f "$stash/mpnet/parts" ] && [ ! -f "$mpnet/model.safetensors" ]; then
  (
    pieces=(); for i in $(seq 0 $(($(cat "$stash/mpnet/parts") - 1))); do pieces+=("$stash/mpnet/model.safetensors.part$i"); done
    ls "${pieces[@]}" > /dev/null 2>&1 || exit 0
    mkdir -p "$mpnet" && tar -xf "$stash/mpnet/files.tar" -C "$mpnet" && cat "${pieces[@]}" > "$mpnet/model.safetensors" \
      && (cd "$mpnet" && sha256sum --quiet -c "$stash/mpnet/model.sha256") && echo "mpnet joined: $mpnet" \
      || { echo "the carried mpnet parts are damaged: no model" >&2; rm -f "$mpnet/model.safetensors"; }
  )
  [ -e models/gpu/all-mpnet-base-v2-fp16 ] || ln -s "$mpnet" models/gpu/all-mpnet-base-v2-fp16
fi
true
