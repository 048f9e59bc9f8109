"""The embedder replica on a GPU: CUDA context, resident weights, per-batch activation peak, throughput.

Standalone (torch + sentence-transformers, and nvidia-ml-py's `pynvml` where it is installed): it
imports nothing from poolserve, so it runs on a machine with a GPU but without Ray or vLLM.

What it runs is the replica's encode path (deployments/embedder.py `Embedder.embed`) on cuda:
`SentenceTransformer(folder, device="cuda", local_files_only=True)`, then the replica's warm-up (one
full batch of `batch_size` texts at max_seq_length), then per request
`model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)`. A request of
B texts with B <= 64 is one forward pass of B sequences.

Each variant runs in a fresh child process, so each one pays and measures its own CUDA context:
  fp32        the model cast with `model.float()` after loading (the plan's "weights" line)
  fp16        the model cast with `model.half()`
  fp32-eager  fp32 with transformers' eager attention (materialized scores), to test the attention
              term of the plan's activation formula (the default attention is SDPA)
The folder may hold fp16 weights (e.g. a half-size copy carried to a remote machine): after the cast,
`torch.cuda.empty_cache()` drops the freed fp16 blocks, so "weights" is what an fp32 file would leave.

Per variant, in bytes:
  context       device memory used after `torch.cuda.init()` and a 4-byte allocation, minus before.
                "Before" can only come from NVML (cudaMemGetInfo needs a context); after is read both
                with NVML and `torch.cuda.mem_get_info`. NVML's per-process usage and nvidia-smi's
                compute-apps list are recorded at every stage too.
  stages        at before_cuda / context / weights_loaded / after_warmup / after_all: NVML device
                and process usage, mem_get_info, memory_allocated/reserved, and the process's
                RssAnon/RssFile (on a unified-memory machine such as a GB10 those are the same pool)
  weights       memory_allocated after load minus before
  per config    (batch 1/16/64 x sequence 32/128/256 tokens; texts built to tokenize to exactly that
                many tokens with [CLS]/[SEP]; the 256 ones are longer and cut at max_seq_length):
                `empty_cache()` + `reset_peak_memory_stats()`, one request, then max_memory_allocated
                and max_memory_reserved minus what was allocated/reserved at rest before it; then
                throughput = texts / median wall time of `--repeats` requests after `--warmup` ones.
  formula       the planner's activation line (planner/plan.py `_side_replicas`), recomputed here
                for each config: batch * seq * (dim*16 + heads*seq*4), heads = max(1, dim // 32)

Usage (on a machine with a GPU):
    python bench/bench_gpu_embedder.py --model models/all-MiniLM-L6-v2 --out results.json
`--device cpu` runs the same code without the CUDA counters (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCHES = (1, 16, 64)
SEQS = (32, 128, 256)
PLAN_BATCH_SIZE = 64  # configs/dgx-spark*.yaml embedder.batch_size
VARIANTS = {
    "fp32": {"dtype": "fp32", "attn": None},
    "fp16": {"dtype": "fp16", "attn": None},
    "fp32-eager": {"dtype": "fp32", "attn": "eager"},
}


# --- counters -----------------------------------------------------------------------------------


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def _nvml_device(nv, index: int) -> dict | None:
    if nv is None:
        return None
    h = nv.nvmlDeviceGetHandleByIndex(index)
    out: dict = {}
    try:
        m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        out.update(total=int(m.total), free=int(m.free), used=int(m.used), reserved=int(m.reserved))
    except Exception:  # noqa: BLE001 - older bindings
        m = nv.nvmlDeviceGetMemoryInfo(h)
        out.update(total=int(m.total), free=int(m.free), used=int(m.used))
    try:
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        mine = [p for p in procs if int(p.pid) == os.getpid()]
        out["process_used"] = int(mine[0].usedGpuMemory) if mine and mine[0].usedGpuMemory is not None else None
        out["processes"] = [
            {"pid": int(p.pid), "used": None if p.usedGpuMemory is None else int(p.usedGpuMemory)} for p in procs
        ]
    except Exception as exc:  # noqa: BLE001
        out["process_used"] = None
        out["processes_error"] = repr(exc)
    return out


def _nvidia_smi_apps() -> str | None:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc!r}"


def _rss() -> dict:
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _stage(torch, cuda: bool, nv, index: int, with_smi: bool = False) -> dict:
    s: dict = {"t": time.time(), "rss": _rss(), "nvml": _nvml_device(nv, index)}
    if cuda and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(index)
        s.update(
            mem_get_info={"free": int(free), "total": int(total), "used": int(total - free)},
            allocated=int(torch.cuda.memory_allocated(index)),
            reserved=int(torch.cuda.memory_reserved(index)),
        )
    if with_smi:
        s["nvidia_smi_apps"] = _nvidia_smi_apps()
    return s


# --- texts ----------------------------------------------------------------------------------------


def _single_token_words(tokenizer) -> list[str]:
    words = sorted(w for w in tokenizer.get_vocab() if w.isascii() and w.isalpha() and w.islower() and 3 <= len(w) <= 9)
    return [w for w in words if len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1][:4000]


def texts_of(tokenizer, words: list[str], n_texts: int, seq: int, max_seq: int, seed: int) -> list[str]:
    """n_texts different texts that the model reads as exactly min(seq, max_seq) tokens (with specials).
    At seq >= max_seq they are 32 words longer, so the model's truncation does the cut (as in the replica)."""
    rng = random.Random(seed)
    n_words = seq - 2 if seq < max_seq else max_seq + 32
    return [" ".join(rng.choice(words) for _ in range(n_words)) for _ in range(n_texts)]


def tokens_read(tokenizer, texts: list[str], max_seq: int) -> list[int]:
    return [
        len(ids)
        for ids in tokenizer(
            texts, truncation=True, max_length=max_seq, return_attention_mask=False, return_token_type_ids=False
        )["input_ids"]
    ]


def formula_bytes(batch: int, seq: int, dim: int) -> int:
    heads = max(1, dim // 32)
    return batch * seq * (dim * 16 + heads * seq * 4)


# --- one variant in this process -------------------------------------------------------------------


def run_variant(args, name: str) -> dict:
    spec = VARIANTS[name]
    nv = _nvml()
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    cuda = args.device == "cuda"
    index = 0
    stages = {"before_cuda": _stage(torch, cuda, nv, index, with_smi=True)}
    out: dict = {"variant": name, "dtype": spec["dtype"], "attn_requested": spec["attn"], "device": args.device}

    # The CUDA context: init + one tiny allocation, nothing else loaded on the device yet.
    if cuda:
        t0 = time.perf_counter()
        torch.cuda.init()
        tiny = torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        out["context_init_s"] = time.perf_counter() - t0
        stages["context"] = _stage(torch, cuda, nv, index, with_smi=True)
        del tiny

    alloc0 = torch.cuda.memory_allocated(index) if cuda else 0
    kwargs = {"model_kwargs": {"attn_implementation": spec["attn"]}} if spec["attn"] else {}
    t0 = time.perf_counter()
    model = SentenceTransformer(str(args.model), device=args.device, local_files_only=True, **kwargs)
    loaded_dtypes = sorted({str(p.dtype) for p in model.parameters()})
    model = model.float() if spec["dtype"] == "fp32" else model.half()
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    out["load_s"] = time.perf_counter() - t0
    out["file_dtypes"] = loaded_dtypes
    out["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    out["param_count"] = sum(p.numel() for p in model.parameters())
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    out["buffer_bytes"] = sum(b.numel() * b.element_size() for b in model.buffers())
    auto = model[0].auto_model
    out["attn_implementation"] = getattr(auto.config, "_attn_implementation", None)
    dim = int((getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)())
    max_seq = int(model.max_seq_length)
    out.update(
        dim=dim,
        max_seq_length=max_seq,
        num_attention_heads=int(auto.config.num_attention_heads),
        hidden_layers=int(auto.config.num_hidden_layers),
        intermediate_size=int(auto.config.intermediate_size),
    )
    stages["weights_loaded"] = _stage(torch, cuda, nv, index)
    weights = (torch.cuda.memory_allocated(index) - alloc0) if cuda else None
    out["weights_allocated"] = weights

    tok = model.tokenizer
    words = _single_token_words(tok)

    def encode(texts):
        return model.encode(
            texts, batch_size=PLAN_BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        ).astype(np.float32)

    # The replica's warm-up: one full batch at the longest input.
    t0 = time.perf_counter()
    encode([" ".join(["warm"] * max_seq)] * PLAN_BATCH_SIZE)
    out["warmup_s"] = time.perf_counter() - t0
    stages["after_warmup"] = _stage(torch, cuda, nv, index, with_smi=True)
    if cuda:
        # What stays allocated beyond the weights after a forward pass (cuBLAS/cuBLASLt workspaces).
        out["allocated_at_rest_after_warmup_minus_weights"] = torch.cuda.memory_allocated(index) - alloc0 - weights
        out["reserved_at_rest_after_warmup"] = torch.cuda.memory_reserved(index)

    configs = []
    for seq in sorted({*SEQS, max_seq}):  # the model's own longest input too (all-mpnet-base-v2: 384)
        for batch in BATCHES:
            texts = texts_of(tok, words, batch, seq, max_seq, seed=seq * 1000 + batch)
            read = tokens_read(tok, texts, max_seq)
            row = {
                "batch": batch,
                "seq_tokens": seq,
                "tokens_read_per_text": sorted(set(read)),
                "formula_activation_bytes": formula_bytes(batch, min(seq, max_seq), dim),
            }
            if cuda:
                gc.collect()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                rest_alloc = torch.cuda.memory_allocated(index)
                rest_res = torch.cuda.memory_reserved(index)
                torch.cuda.reset_peak_memory_stats(index)
                vec = encode(texts)
                torch.cuda.synchronize()
                peak_alloc = torch.cuda.max_memory_allocated(index)
                peak_res = torch.cuda.max_memory_reserved(index)
                row.update(
                    rest_allocated=rest_alloc,
                    rest_reserved=rest_res,
                    max_allocated=peak_alloc,
                    max_reserved=peak_res,
                    peak_allocated_minus_rest=peak_alloc - rest_alloc,
                    peak_reserved_minus_rest=peak_res - rest_res,
                    peak_allocated_minus_weights=peak_alloc - alloc0 - weights,
                    peak_reserved_minus_weights=peak_res - alloc0 - weights,
                )
                row["measured_over_formula"] = round((peak_alloc - rest_alloc) / row["formula_activation_bytes"], 4)
            else:
                vec = encode(texts)
            row["vector_shape"] = list(vec.shape)
            for _ in range(args.warmup):
                encode(texts)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                encode(texts)  # convert_to_numpy copies to host: the wall time includes the sync
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            row.update(
                repeats=args.repeats,
                median_s=med,
                min_s=min(times),
                max_s=max(times),
                texts_per_s=batch / med,
                tokens_per_s=sum(read) / med,
            )
            configs.append(row)
            print(
                f"[{name}] batch {batch:3d} seq {seq:3d}: "
                + (
                    f"peak +{row['peak_allocated_minus_rest'] / 2**20:8.1f} MiB alloc, "
                    f"+{row['peak_reserved_minus_rest'] / 2**20:8.1f} MiB reserved, "
                    f"formula {row['formula_activation_bytes'] / 2**20:8.1f} MiB, "
                    if cuda
                    else ""
                )
                + f"{row['texts_per_s']:9.1f} texts/s (median {med * 1e3:.2f} ms)",
                flush=True,
            )
    out["configs"] = configs

    # Bulk ingest: --bulk-texts texts of max_seq_length tokens, batch_size 64 (16 forward passes per call at 1024).
    texts = texts_of(tok, words, args.bulk_texts, max_seq, max_seq, seed=7)
    encode(texts)
    times = []
    for _ in range(max(3, args.repeats // 4)):
        t0 = time.perf_counter()
        encode(texts)
        times.append(time.perf_counter() - t0)
    out["bulk"] = {
        "texts": args.bulk_texts,
        "seq_tokens": max_seq,
        "batch_size": PLAN_BATCH_SIZE,
        "median_s": statistics.median(times),
        "texts_per_s": args.bulk_texts / statistics.median(times),
    }
    stages["after_all"] = _stage(torch, cuda, nv, index, with_smi=True)
    out["stages"] = stages
    if cuda:
        ctx = stages["context"]
        before = stages["before_cuda"]
        ctxb: dict = {"torch_reserved_at_context": ctx["reserved"]}
        if before.get("nvml") and ctx.get("nvml"):
            ctxb["nvml_device_used_delta"] = ctx["nvml"]["used"] - before["nvml"]["used"]
            ctxb["nvml_free_before_minus_mem_get_info_free_after"] = (
                before["nvml"]["free"] - ctx["mem_get_info"]["free"]
            )
            ctxb["nvml_process_used"] = ctx["nvml"].get("process_used")
        end = stages["after_all"]
        if end.get("nvml") and end["nvml"].get("process_used") is not None:
            # Everything the process holds on the device outside torch's caching allocator, at the end:
            # the context plus lazily loaded kernel modules (cuBLAS, cuDNN...).
            ctxb["nvml_process_used_after_all"] = end["nvml"]["process_used"]
            ctxb["outside_allocator_after_all"] = end["nvml"]["process_used"] - end["reserved"]
        if before.get("nvml") and end.get("nvml"):
            ctxb["nvml_device_used_delta_after_all"] = end["nvml"]["used"] - before["nvml"]["used"]
            ctxb["outside_allocator_after_all_device_delta"] = (
                end["nvml"]["used"] - before["nvml"]["used"] - end["reserved"]
            )
        out["context"] = ctxb
    return out


# --- orchestration ----------------------------------------------------------------------------------


def environment(args) -> dict:
    import torch
    import sentence_transformers
    import transformers

    env = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING"),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "model": str(args.model),
    }
    nv = _nvml()
    if nv is not None:

        def s(v):
            return v.decode() if isinstance(v, bytes) else v

        env["driver"] = s(nv.nvmlSystemGetDriverVersion())
        try:
            v = nv.nvmlSystemGetCudaDriverVersion()
            env["cuda_driver_api"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:  # noqa: BLE001
            pass
        h = nv.nvmlDeviceGetHandleByIndex(0)
        env["gpu_name_nvml"] = s(nv.nvmlDeviceGetName(h))
        env["gpu_total_bytes_nvml"] = int(nv.nvmlDeviceGetMemoryInfo(h).total)
    try:
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        env["nvidia_smi"] = f"unavailable: {exc!r}"
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="sentence-transformers folder")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bulk-texts", type=int, default=1024, help="texts in the bulk-ingest throughput row")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        args.out.write_text(json.dumps(run_variant(args, args.child), indent=1))
        return

    result: dict = {
        "script": "bench/bench_gpu_embedder.py",
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "plan_batch_size": PLAN_BATCH_SIZE,
        "variants": {},
        "errors": {},
    }
    # Versions are read in a child too, so this process never touches the GPU.
    with tempfile.TemporaryDirectory() as tmp:
        env_file = Path(tmp) / "env.json"
        code = (
            "import json,sys; sys.argv=['x']; from pathlib import Path; import argparse; "
            f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import bench_gpu_embedder as b; "
            f"a=argparse.Namespace(model={str(args.model)!r}); env=b.environment(a); import torch; "
            "env['gpu_name_torch']=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None; "
            "env['cudnn']=torch.backends.cudnn.version() if torch.cuda.is_available() else None; "
            f"Path({str(env_file)!r}).write_text(json.dumps(env))"
        )
        subprocess.run([sys.executable, "-c", code], check=False)
        result["environment"] = json.loads(env_file.read_text()) if env_file.exists() else None
        for name in args.variants.split(","):
            child_out = Path(tmp) / f"{name}.json"
            cmd = [
                sys.executable,
                __file__,
                "--model",
                str(args.model),
                "--out",
                str(child_out),
                "--device",
                args.device,
                "--repeats",
                str(args.repeats),
                "--warmup",
                str(args.warmup),
                "--bulk-texts",
                str(args.bulk_texts),
                "--child",
                name,
            ]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, check=False)
            if proc.returncode == 0 and child_out.exists():
                result["variants"][name] = json.loads(child_out.read_text())
                result["variants"][name]["child_wall_s"] = time.perf_counter() - t0
            else:
                result["errors"][name] = f"child exited {proc.returncode}"
            time.sleep(1.0)  # let the driver drop the exited child's context before the next one's "before"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    for name, v in result["variants"].items():
        if "context" in v:
            print(name, "context", json.dumps(v["context"]), "weights", v["weights_allocated"])


if __name__ == "__main__":
    main()
