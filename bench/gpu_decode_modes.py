"""Single-stream decode of raw vLLM's server under several compilation settings, against the card's HBM
roofline: which setting the GPU profiles should plan (issue 45's goal is >= 0.7 of the roofline for the 27B
without speculation). Same profile, engine arguments and environment for each; only compilation_config
(and enforce_eager) differ. One server at a time.

    python3 bench/gpu_decode_modes.py --profile configs/gh200-bench.yaml --out OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.gpu_probe import decode_roofline  # noqa: E402
from bench.harness.engine import engine_setup  # noqa: E402
from bench.harness.procs import raw_vllm_server  # noqa: E402
from bench.harness.serving import ServingLoad, run_serving_load  # noqa: E402
from planner.plan import build_plan  # noqa: E402
from planner.profile import load_profile  # noqa: E402

# name -> changes to the planned compilation_config (planner/graphs.py: FULL_DECODE_ONLY graphs at the planned
# capture sizes, no torch.compile). The sizes stay the planned ones, so only compilation differs.
MODES = {
    "planned": {},
    "compiled-full-decode-only": {"mode": 3},
    "compiled-full-and-piecewise": {"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"},
}


def mode_overrides(planned: dict | None, name: str) -> dict:
    """The engine-argument overrides of one mode: the planned compilation_config with its changes."""
    if not MODES[name]:
        return {}
    return {"enforce_eager": False, "compilation_config": {**(planned or {}), **MODES[name]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=Path("configs/gh200-bench.yaml"))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated names of MODES")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--start-timeout", type=float, default=420, help="seconds for one server to start")
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu"))
    args = parser.parse_args()
    import pynvml

    pynvml.nvmlInit()
    device = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    device = device.decode() if isinstance(device, bytes) else device
    weight_bytes = build_plan(load_profile(args.profile)).engines["chat"].weight_bytes
    roofline = decode_roofline(weight_bytes, device)
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.modes.split(","):
        planned = engine_setup(args.profile).args.compilation_config
        setup = engine_setup(args.profile, mode_overrides(planned, name))
        workdir = Path(tempfile.mkdtemp(prefix="decode-mode-"))
        row = {"mode": name, "compilation_config": setup.args.compilation_config}
        try:
            with raw_vllm_server(setup, workdir, timeout_s=args.start_timeout) as server:
                row["start_s"] = round(server.start_s, 1)
                metrics = run_serving_load(
                    server.base_url,
                    setup.served_model_name,
                    setup.model,
                    ServingLoad(args.prompts, 1, 256, 128),
                    workdir / "load.log",
                )
            tok_s = 1000 / metrics["median_tpot_ms"]
            row.update(
                tpot_p50_ms=round(metrics["median_tpot_ms"], 2),
                decode_tok_s=round(tok_s, 1),
                ttft_p50_ms=round(metrics["median_ttft_ms"], 1),
                of_roofline=round(tok_s / roofline, 3),
            )
        except Exception as exc:  # a mode that fails to start is a result too
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            row["log_tail"] = (
                (workdir / "vllm.log").read_text(errors="replace")[-3000:] if (workdir / "vllm.log").exists() else ""
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
        report = {
            "profile": str(args.profile),
            "device": device,
            "weight_bytes": weight_bytes,
            "roofline_tok_s": round(roofline, 1),
            "rows": rows,
        }
        (args.out / "gpu-decode-modes.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
