# Sourced on the GPU machine (`. scripts/gpu_env.sh`, docs/GPU.md): the offline bundle (/tmp/site), the stack's extra wheels (/tmp/site2), this checkout.
export PYTHONPATH=/tmp/site:/tmp/site2:$PWD PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
for d in Qwen3.8-27B-4layer-dummy Qwen3.8-27B-DSpark-dummy; do
  [ -d models/gpu/$d ] && for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
    [ -f models/gpu/$d/$f ] || cp models/gpu/Qwen3.8-27B-dummy/$f models/gpu/$d/ 2>/dev/null; done
done
# Kernel caches carried from an earlier GPU session in parts (scripts/gpu_cache.sh), unpacked once per machine.
if [ -f /tmp/gpucache/gpucache.sha256 ] && [ ! -e /tmp/.gpucache-loaded ]; then
  bash scripts/gpu_cache.sh load /tmp/gpucache && touch /tmp/.gpucache-loaded
fi
true
