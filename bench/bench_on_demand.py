"""Model swaps through the real stack (issue 48 item 5): start a profile with on-demand engines with
`poolserve up` (its own state dir), then, through the openai client with a tenant key, alternate streamed
requests between two on-demand models that cannot both be awake, and measure each swap.

Recorded, each step on its own (one failure does not lose the rest):
- every request's TTFT (streamed: the first chunk with a choice) and total time, whether it found its engine
  asleep (a swap: the other engine sleeps, this one wakes), and the wake seconds the coordinator counted for
  it; after each swap one more request to the same, now awake, model (the same request without a swap);
  p50/p95 of swap TTFT;
- `/metrics` wake/sleep counters and wake seconds, and `/v1/models` states, before and after;
- after every sleep and every wake, each on-demand engine's memory against the plan (Plan.on_demand): on a
  discrete GPU NVML's bytes of the engine's processes (vLLM's `ray::RayWorkerProc` worker and its
  EngineCore, told apart by when they appeared: those of the engine awake at start, then each engine's at
  its first wake); on a CPU the PSS of the engine's replica and its processes (/status, as the CPU tests
  read it), against the planned awake bytes (at rest: without the replica's growth) or asleep bytes;
- the cold start of the same engines in the same run: on a GPU an engine beyond the plan's awake set is not
  started until its first request, so its first wake is a fresh engine start, measured beside its later
  vLLM wake-ups; on a CPU vLLM has no sleep mode and every wake is a cold start (the result says so);
- `--cycles N`: N sleep/wake cycles of the engine awake at start, counting failed requests, replicas Serve
  replaced (crashes), and its memory asleep and awake each time within +-2% of the plan and of cycle 1 (on a
  GPU NVML's bytes every cycle, /status, and with it the replica's pid, one cycle in FULL_STATUS_EVERY);
- `poolserve down` at the end, and what is left (the stack's processes; on a GPU the device's processes).

    python3 bench/bench_on_demand.py --profile configs/gpu-on-demand.yaml --out DIR [--swaps 20] [--cycles N]

Writes DIR/on-demand-<profile>.json (after every step) and DIR/on-demand-<profile>.log, and copies the
stack's serve.log beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.timing import percentile  # noqa: E402

GIB = 2**30
MIB = 2**20
TOLERANCE = 0.02  # endurance: memory back to its plan (and to cycle 1) within +-2% each time
PROGRESS_SAVE_S = 5.0  # a run cut short keeps every swap and cycle but those of its last 5 seconds
FULL_STATUS_EVERY = 25  # GPU cycles: one in 25 reads /status (pids, restarts); NVML gives the bytes every cycle
PROMPT = "Say OK."
# The gateway's on-demand counters (deployments/wake_coordinator.py), as Prometheus names the samples.
WAKES, SLEEPS, WAKE_SECONDS = (
    "poolserve_on_demand_wakes_total",
    "poolserve_on_demand_sleeps_total",
    "poolserve_on_demand_wake_seconds_total",
)
# GPU processes that belong to replicas other than the chat engines (bench/gpu_probe.py role_of).
NOT_AN_ENGINE = ("embedder", "retriever", "gateway")


# ---- pure logic (tests/unit/bench/test_bench_on_demand.py) ----


def parse_on_demand_metrics(text: str) -> dict:
    """The on-demand counters of a /metrics text: wakes and wake seconds by model, sleeps by model and reason
    ({"wakes": {model: n}, "sleeps": {model: {reason: n}}, "wake_seconds": {model: s}})."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict = {"wakes": {}, "sleeps": {}, "wake_seconds": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            if sample.name == WAKES:
                found["wakes"][model] = found["wakes"].get(model, 0) + sample.value
            elif sample.name == WAKE_SECONDS:
                found["wake_seconds"][model] = found["wake_seconds"].get(model, 0) + sample.value
            elif sample.name == SLEEPS:
                reason = sample.labels.get("reason", "")
                found["sleeps"].setdefault(model, {})[reason] = sample.value
    return found


def metrics_delta(before: dict, after: dict) -> dict:
    """What happened between two parse_on_demand_metrics readings (only what changed)."""
    delta: dict = {"wakes": {}, "sleeps": {}, "wake_seconds": {}}
    for key in ("wakes", "wake_seconds"):
        for model, value in after[key].items():
            if value - before[key].get(model, 0):
                delta[key][model] = round(value - before[key].get(model, 0), 3)
    for model, reasons in after["sleeps"].items():
        for reason, value in reasons.items():
            change = value - before["sleeps"].get(model, {}).get(reason, 0)
            if change:
                delta["sleeps"].setdefault(model, {})[reason] = change
    return delta


def summary(values: list[float]) -> dict | None:
    """n, p50, p95, min and max (seconds, rounded), or None for no values."""
    if not values:
        return None
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 3),
        "p95": round(percentile(values, 95), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def ratio_check(measured: int | None, planned: int, tolerance: float = TOLERANCE) -> dict:
    """Measured bytes against planned: the ratio and whether it is within +-tolerance. A plan of 0 bytes (a
    stopped CPU engine) has no ratio: within only when nothing is measured either."""
    if measured is None:
        return {"measured_bytes": None, "planned_bytes": planned, "ratio": None, "within": False}
    if planned <= 0:
        return {"measured_bytes": measured, "planned_bytes": planned, "ratio": None, "within": measured == 0}
    ratio = measured / planned
    return {
        "measured_bytes": measured,
        "planned_bytes": planned,
        "ratio": round(ratio, 4),
        "within": abs(ratio - 1) <= tolerance,
    }


def planned_for(engine: dict, state: str) -> dict:
    """The plan's bytes for an engine in a state: asleep its asleep bytes; awake its awake bytes, and at rest
    those less the replica's growth (activations and traffic it releases after a batch), as
    bench_gpu_plan.compare reads a replica at rest. `engine`: one entry of plan_engines()."""
    if state == "asleep":
        at_rest = engine.get("asleep_at_rest_bytes", engine["asleep_bytes"])
        return {"planned_bytes": engine["asleep_bytes"], "planned_at_rest_bytes": at_rest}
    return {"planned_bytes": engine["awake_bytes"], "planned_at_rest_bytes": engine["awake_bytes"] - engine["growth"]}


def attribute_new_pids(
    owner: dict[int, str], roles: dict[int, str], engine: str, replica_of: dict[int, str] | None = None
) -> list[int]:
    """GPU processes not yet owned and not another replica's (embedder, retriever, gateway) become `engine`'s:
    called with the engine awake at start, then with each engine right after its first wake. A process that
    is an engine replica's own (/status's pids; `replica_of`) goes to that engine whatever is claiming. Returns
    the pids given to `engine`."""
    new = []
    for pid, role in sorted(roles.items()):
        if pid in owner or role in NOT_AN_ENGINE:
            continue
        owner[pid] = (replica_of or {}).get(pid, engine)
        if owner[pid] == engine:
            new.append(pid)
    return new


def engine_gpu_bytes(owner: dict[int, str], processes: dict[int, int], engine: str) -> int:
    """NVML bytes of the processes attributed to one engine (0 for those that have exited)."""
    return sum(nbytes for pid, nbytes in processes.items() if owner.get(pid) == engine)


def wakes_in_run(swaps: int, cycles: int) -> int:
    """The most wakes of one engine in this run: half the swaps, rounded up, and one per cycle."""
    return (swaps + 1) // 2 + cycles


def wakes_over_budget(engines: dict[str, dict], swaps: int, cycles: int) -> list[str]:
    """The engines whose wakes in this run exceed their tenant_wakes_per_hour: the demo tenant would get 429 (a
    100-cycle CPU run met the 30 of configs/cpu-on-demand.yaml at its 30th wake, 2026-12-07)."""
    wakes = wakes_in_run(swaps, cycles)
    return [name for name, e in engines.items() if wakes > e.get("tenant_wakes_per_hour", wakes)]


def alternation(first: str, second: str, swaps: int) -> list[str]:
    """The models of `swaps` swap requests, alternating, starting with `first` (the one asleep)."""
    return [first if i % 2 == 0 else second for i in range(swaps)]


def endurance(cycles: list[dict], tolerance: float = TOLERANCE) -> dict:
    """The endurance verdict over cycles: each cycle {"requests_failed", "restarted", "asleep": bytes|None,
    "awake": bytes|None, "asleep_check", "awake_check"} (ratio_check against the plan). Memory is back to the
    plan when every check is within; back to cycle 1 when each reading is within +-tolerance of cycle 1's. The
    growth per cycle (a least-squares slope, bytes) tells a leak from the readings' noise."""

    def near_first(key: str) -> bool:
        first = next((c[key] for c in cycles if c.get(key) is not None), None)
        values = [c.get(key) for c in cycles]
        if first is None or any(v is None for v in values):
            return False
        if first == 0:
            return all(v == 0 for v in values)
        return all(abs(v / first - 1) <= tolerance for v in values)

    return {
        "cycles": len(cycles),
        "requests_failed": sum(c.get("requests_failed", 0) for c in cycles),
        "restarts": sum(1 for c in cycles if c.get("restarted")),
        "back_to_plan_every_cycle": bool(cycles)
        and all(c.get("asleep_check", {}).get("within") and c.get("awake_check", {}).get("within") for c in cycles),
        "asleep_back_to_cycle_1": near_first("asleep"),
        "awake_back_to_cycle_1": near_first("awake"),
        "asleep_growth_per_cycle_bytes": growth_per_cycle([c.get("asleep") for c in cycles]),
        "awake_growth_per_cycle_bytes": growth_per_cycle([c.get("awake") for c in cycles]),
        "cycle_seconds": summary([c["seconds"] for c in cycles if c.get("seconds") is not None]),
    }


def growth_per_cycle(readings: list[int | None]) -> int | None:
    """The least-squares slope of the readings over their cycle numbers (None below two readings)."""
    points = [(i, v) for i, v in enumerate(readings) if v is not None]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in points) / spread)


# ---- the stack ----


def level_1_weight_bytes(host_breakdown: dict[str, int]) -> int:
    """The weights a level-1 sleep keeps in host memory (what a wake copies back), from the planned host lines."""
    return sum(v for k, v in host_breakdown.items() if k.endswith("(on host, level 1)"))


# The host-to-device copy a level-1 wake is measured against: pinned host memory to the device, in a child
# process (this one never holds a CUDA context: the device must be empty once the stack stops). A buffer of at
# most COPY_PROBE_BYTES gives the bandwidth; a 50 GiB pinned buffer would only take longer to register.
COPY_PROBE_BYTES = 8 * GIB
HOST_TO_DEVICE = """
import json, sys, time, torch
size, repeats = int(sys.argv[1]), int(sys.argv[2])
host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
device = torch.empty(size, dtype=torch.uint8, device="cuda")
seconds = []
for _ in range(repeats):
    torch.cuda.synchronize()
    started = time.perf_counter()
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    seconds.append(time.perf_counter() - started)
print(json.dumps({"bytes": size, "seconds": seconds}))
"""


def copy_seconds_for(weight_bytes: int, probe: dict) -> dict:
    """The time to copy `weight_bytes` host to device at the probe's best bandwidth (pure: unit-tested)."""
    best = min(probe["seconds"])
    bandwidth = probe["bytes"] / best
    return {
        "probe_bytes": probe["bytes"],
        "probe_seconds": [round(s, 4) for s in probe["seconds"]],
        "bandwidth_gb_per_s": round(bandwidth / 1e9, 2),
        "weight_bytes": weight_bytes,
        "copy_s": round(weight_bytes / bandwidth, 4),
    }


def wake_against_copy(wake_s: dict | None, copy: dict | None) -> float | None:
    """A level-1 wake's p50 over the plain copy of its weights (the goal: at most 1.5)."""
    if not wake_s or not copy or not copy.get("copy_s"):
        return None
    return round(wake_s["p50"] / copy["copy_s"], 3)


def host_to_device_copy(weight_bytes: int, repeats: int = 3) -> dict:
    import subprocess

    size = min(weight_bytes, COPY_PROBE_BYTES)
    done = subprocess.run(
        [sys.executable, "-c", HOST_TO_DEVICE, str(size), str(repeats)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return copy_seconds_for(weight_bytes, json.loads(done.stdout.strip().splitlines()[-1]))


def plan_engines(plan) -> dict[str, dict]:
    """Each on-demand engine of the plan by replica name: its model id, sleep/wake kind and bytes."""
    engines = {}
    for name, e in plan.on_demand.engines.items():
        engines[name] = {
            "model_id": e.model_id,
            "sleep": e.sleep,
            "wake": e.wake,
            "awake_bytes": e.awake_bytes,
            "asleep_bytes": e.asleep_bytes,
            "asleep_at_rest_bytes": e.asleep_at_rest_bytes,
            "asleep_host_bytes": e.asleep_host_bytes,
            "level_1_weight_bytes": level_1_weight_bytes(e.asleep_host_breakdown),
            "growth": plan.replica(name).growth_bytes,
            "tenant_wakes_per_hour": e.tenant_wakes_per_hour,
        }
    return engines


def replicas_from_states(known: dict[str, dict], engines: dict[str, dict], states: dict[str, str | None]) -> dict:
    """The replicas as /status last gave them, each engine's state from /v1/models (`states`, by model id): what a
    GPU reading needs between two /status calls, whose every call measures every replica's memory on the host."""
    return {
        name: {**replica, "engine_state": states.get(engines[name]["model_id"])} if name in engines else replica
        for name, replica in known.items()
    }


class Probe:
    """Each on-demand engine's memory: NVML per process on a discrete GPU, /status's PSS on a CPU."""

    def __init__(self, base_url: str, admin_key: str, engines: dict[str, dict], sampler=None):
        self.base_url, self.admin_key, self.engines, self.sampler = base_url, admin_key, engines, sampler
        self.owner: dict[int, str] = {}  # GPU pid -> engine (replica name)
        self.known: dict[str, dict] = {}  # the last /status's replicas (their pids)

    def status(self) -> dict:
        import httpx

        reply = httpx.get(f"{self.base_url}/status", headers={"Authorization": f"Bearer {self.admin_key}"}, timeout=120)
        reply.raise_for_status()
        self.known = {r["name"]: r for r in reply.json().get("replicas", [])}
        return self.known

    def claim(self, engine: str) -> list[int]:
        """On a GPU: the processes that appeared since the last claim are `engine`'s (see attribute_new_pids)."""
        if self.sampler is None:
            return []
        from bench.bench_gpu_plan import _title
        from bench.gpu_probe import role_of

        replica_of = {pid: n for n, r in self.status().items() if n in self.engines for pid in r.get("pids") or []}
        roles = {pid: role_of(_title(pid)) for pid in self.sampler.read().processes}
        return attribute_new_pids(self.owner, roles, engine, replica_of)

    def read(self, states: dict[str, str | None] | None = None) -> dict[str, dict]:
        """Each engine's state (/status's engine_state), its replica's pid and its measured bytes with the
        plan's for that state. On a GPU, `states` (/v1/models') stands in for a new /status: the bytes are
        NVML's either way, and the pids those /status gave last."""
        light = states is not None and self.sampler is not None and self.known
        replicas = replicas_from_states(self.known, self.engines, states) if light else self.status()
        gpu = self.sampler.read() if self.sampler is not None else None
        out = {}
        for name, engine in self.engines.items():
            r = replicas.get(name, {})
            state = r.get("engine_state")
            entry = {"state": state, "replica_pid": (r.get("pids") or [None])[0], "pids": r.get("pids")}
            if gpu is not None:
                measured = engine_gpu_bytes(self.owner, gpu.processes, name)
                entry["gpu_pids"] = sorted(p for p, e in self.owner.items() if e == name and p in gpu.processes)
                # its processes' host memory: asleep at level 1 the weights' copies are there (planned beside the pool)
                entry["host_rss_bytes"] = resident_bytes({*(entry["pids"] or []), *entry["gpu_pids"]})
                if state == "asleep":
                    entry["planned_host_asleep_bytes"] = engine.get("asleep_host_bytes")
            else:
                measured = r.get("measured_bytes")
                entry["parts"] = pss_parts(r)  # which pages move between readings (issue 48's asleep +-2%)
            entry["measured_bytes"] = measured
            if state in ("awake", "asleep"):
                planned = planned_for(engine, state)
                entry |= planned
                entry["vs_plan"] = ratio_check(measured, planned["planned_bytes"], 1.0)["ratio"]
                entry["vs_plan_at_rest"] = ratio_check(measured, planned["planned_at_rest_bytes"])
            out[name] = entry
        if gpu is not None:
            import psutil

            host = psutil.virtual_memory()
            out["_host"] = {"total_bytes": host.total, "available_bytes": host.available, "used_bytes": host.used}
            out["_device"] = {
                "used_bytes": gpu.used,
                "free_bytes": gpu.free,
                "unattributed": {p: b for p, b in gpu.processes.items() if p not in self.owner},
            }
        return out


# The parts of a replica's PSS that /status gives beside its total (system/process_memory.py).
PSS_PARTS = ("anon_bytes", "file_bytes", "shmem_bytes")


def pss_parts(replica: dict) -> dict[str, int | None]:
    """A CPU replica's PSS by kind of page, from its /status entry: heap (anon), mapped files, shared memory."""
    return {key: replica.get(key) for key in PSS_PARTS}


def resident_bytes(pids) -> int:
    """The resident bytes of these processes (RSS: pinned and mapped pages included), those still running; read
    at every GPU cycle, so from statm, not smaps_rollup (two engines' pinned copies cost ~0.2 s a reading)."""
    from system.process_memory import processes_resident_bytes

    return processes_resident_bytes(pids)


def ask(client, model: str, max_tokens: int = 16) -> dict:
    """One streamed chat request: TTFT (first chunk with a choice), total seconds, chunks and tokens."""
    started = time.perf_counter()
    first, chunks, usage, finish = None, 0, None, None
    for chunk in client.chat.completions.create(
        model=model,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": PROMPT}],
    ):
        if chunk.choices and first is None:
            first = time.perf_counter()
        chunks += 1
        usage = chunk.usage or usage
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    ended = time.perf_counter()
    return {
        "ttft_s": round(first - started, 4) if first else None,
        "total_s": round(ended - started, 4),
        "chunks": chunks,
        "finish_reason": finish,
        "completion_tokens": usage.completion_tokens if usage else None,
    }


class Bench:
    def __init__(self, server, admin_key: str, plan, sampler, log: Callable[[str], None], progress=None):
        from openai import OpenAI

        self.server, self.admin_key, self.log = server, admin_key, log
        # progress(section, record): each swap or cycle as it ends, saved before the next (a run cut short keeps it)
        self.progress = progress or (lambda section, record: None)
        self.engines = plan_engines(plan)
        self.by_model = {e["model_id"]: name for name, e in self.engines.items()}
        self.gpu = sampler is not None
        self.probe = Probe(server.base_url, admin_key, self.engines, sampler)
        # max_retries 0: a failed request is a result, never retried out of sight; a wake may take minutes
        self.client = OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, timeout=900, max_retries=0)
        self.woken: set[str] = set()  # engines that have been awake in this run (a GPU's next wake is vLLM's)
        self.read_after: tuple[dict, dict] | None = None  # (states, counters) after the last light request

    def metrics(self) -> dict:
        import httpx

        reply = httpx.get(
            f"{self.server.base_url}/metrics", headers={"Authorization": f"Bearer {self.admin_key}"}, timeout=60
        )
        reply.raise_for_status()
        return parse_on_demand_metrics(reply.text)

    def states(self) -> dict[str, str | None]:
        """/v1/models' status of each card, through the openai client."""
        return {m.id: (m.model_extra or {}).get("status") for m in self.client.models.list().data}

    def start(self) -> dict:
        """At start: the awake engines own the GPU processes there are (NVML), and their state."""
        states = self.states()
        awake = [name for name, e in self.engines.items() if states.get(e["model_id"]) == "awake"]
        claimed = {}
        if len(awake) == 1:
            claimed[awake[0]] = self.probe.claim(awake[0])
        self.woken |= set(awake)
        return {"states": states, "awake": awake, "gpu_pids_claimed": claimed}

    def request(self, model: str, light_reading: bool = False) -> dict:
        """One request to `model`, with whether it found the engine asleep, the coordinator's counters for
        it, and on a swap each engine's memory after it (the other asleep, this one awake). `light_reading` (GPU
        cycles): the memory reading takes the states from /v1/models instead of a new /status (Probe.read), and
        the states and counters read after one request are the next one's before (nothing runs between them)."""
        name = self.by_model[model]
        record: dict = {"model": model}
        try:
            if light_reading and self.read_after is not None:
                before_states, before = self.read_after
            else:
                before_states, before = self.states(), self.metrics()
        except Exception as exc:
            return {**record, "ok": False, "error": f"before: {type(exc).__name__}: {str(exc)[:300]}"}
        self.read_after = None
        record["state_before"] = before_states.get(model)
        record["swap"] = before_states.get(model) != "awake"
        if record["swap"]:
            record["wake_kind"] = (
                "cold_start" if (not self.gpu or name not in self.woken) else self.engines[name]["wake"]
            )
        try:
            record |= {"ok": True, **ask(self.client, model)}
        except Exception as exc:
            record |= {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        try:
            after = self.metrics()
            record["metrics_delta"] = metrics_delta(before, after)
            record["wake_s"] = record["metrics_delta"]["wake_seconds"].get(model)
            states_after = self.states() if light_reading else None
            if record["swap"] and record["ok"]:
                if name not in self.woken:
                    record["gpu_pids_claimed"] = self.probe.claim(name)
                self.woken.add(name)
                record["memory"] = self.probe.read(states_after)
            if light_reading:
                self.read_after = (states_after, after)
        except Exception as exc:
            record["after_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return record

    def swaps(self, count: int) -> dict:
        """`count` swap requests alternating between two on-demand models, each followed by the same request
        to the now awake model (no swap)."""
        names = list(self.engines)[:2]
        states = self.states()
        models = [self.engines[n]["model_id"] for n in names]
        asleep = [m for m in models if states.get(m) != "awake"]
        first = asleep[0] if asleep else models[1]
        second = models[0] if first == models[1] else models[1]
        records = []
        for index, model in enumerate(alternation(first, second, count)):
            swap = self.request(model)
            warm = self.request(model)
            records.append({"index": index, "swap": swap, "no_swap": warm})
            self.progress("swaps", records[-1])
            self.log(
                f"swap {index + 1}/{count} -> {model}: swap={swap.get('swap')} ok={swap.get('ok')} "
                f"ttft={swap.get('ttft_s')} s wake={swap.get('wake_s')} s ({swap.get('wake_kind')}); "
                f"then ttft={warm.get('ttft_s')} s (swap={warm.get('swap')})"
            )
        return {"models": [first, second], "requests": records, **swap_summary(records)}

    def cycles(self, count: int) -> dict:
        """`count` sleep/wake cycles of the engine awake now: a request to the other model (it sleeps), then
        one to it (it wakes). Each cycle: failed requests, whether its replica was replaced, its bytes."""
        states = self.states()
        names = list(self.engines)[:2]
        awake = next((n for n in names if states.get(self.engines[n]["model_id"]) == "awake"), names[0])
        other = next(n for n in names if n != awake)
        model, other_model = self.engines[awake]["model_id"], self.engines[other]["model_id"]
        cycles = []
        replica_pid = (self.probe.read().get(awake) or {}).get("replica_pid")
        for index in range(count):
            cycle: dict = {"index": index, "requests_failed": 0}
            started = time.perf_counter()
            # /status measures every replica on the host (gc, malloc_trim and smaps reads in each): on a GPU one
            # cycle in FULL_STATUS_EVERY reads it (and so the replica's pid, for restarts), the others NVML alone
            light = self.gpu and index % FULL_STATUS_EVERY != 0 and index != count - 1
            slept = self.request(other_model, light_reading=light)
            woke = self.request(model, light_reading=light)
            for key, rec in (("sleep", slept), ("wake", woke)):
                cycle[key] = {k: rec.get(k) for k in ("ok", "swap", "ttft_s", "total_s", "wake_s", "error")}
                cycle["requests_failed"] += 0 if rec.get("ok") else 1
            asleep = (slept.get("memory") or {}).get(awake, {})
            awake_now = (woke.get("memory") or {}).get(awake, {})
            cycle["asleep"], cycle["awake"] = asleep.get("measured_bytes"), awake_now.get("measured_bytes")
            if "parts" in asleep:  # a CPU: the asleep replica's pages by kind, to see which ones move
                cycle["asleep_parts"], cycle["awake_parts"] = asleep["parts"], awake_now.get("parts")
            cycle["asleep_check"] = asleep.get("vs_plan_at_rest") or {"within": False}
            cycle["awake_check"] = awake_now.get("vs_plan_at_rest") or {"within": False}
            cycle["status_read"] = not light
            # the cycle's wall time beside its two requests': what the bench's own readings cost
            cycle["seconds"] = round(time.perf_counter() - started, 4)
            pid = awake_now.get("replica_pid")
            cycle["restarted"] = bool(replica_pid and pid and pid != replica_pid)
            replica_pid = pid or replica_pid
            cycles.append(cycle)
            self.progress("cycles", cycle)
            self.log(
                f"cycle {index + 1}/{count} of {model}: failed={cycle['requests_failed']} "
                f"asleep={_mib(cycle['asleep'])} awake={_mib(cycle['awake'])} restarted={cycle['restarted']}"
            )
        return {"engine": awake, "model": model, "per_cycle": cycles, **endurance(cycles)}


def _mib(value) -> str:
    return f"{value / MIB:.0f} MiB" if isinstance(value, (int, float)) else "-"


def swap_summary(records: list[dict]) -> dict:
    """Percentiles of swap and no-swap TTFT, by wake kind, and how many requests failed."""
    swaps = [r["swap"] for r in records if r["swap"].get("ok") and r["swap"].get("swap")]
    warm = [r["no_swap"] for r in records if r["no_swap"].get("ok") and not r["no_swap"].get("swap")]
    kinds = sorted({s.get("wake_kind") for s in swaps})
    return {
        "swap_ttft_s": summary([s["ttft_s"] for s in swaps if s.get("ttft_s") is not None]),
        "swap_total_s": summary([s["total_s"] for s in swaps]),
        "swap_wake_s": summary([s["wake_s"] for s in swaps if s.get("wake_s") is not None]),
        "swap_ttft_s_by_wake_kind": {
            k: summary([s["ttft_s"] for s in swaps if s.get("wake_kind") == k and s.get("ttft_s") is not None])
            for k in kinds
        },
        "no_swap_ttft_s": summary([w["ttft_s"] for w in warm if w.get("ttft_s") is not None]),
        "requests_failed": sum(1 for r in records for k in ("swap", "no_swap") if not r[k].get("ok")),
        "swaps_that_found_the_engine_awake": sum(1 for r in records if r["swap"].get("ok") and not r["swap"]["swap"]),
    }


def cold_start_section(swaps: dict, gpu: bool) -> dict:
    """The cold start beside the wakes: on a GPU each engine's first wake in this run (a fresh engine start:
    engines beyond the awake set are not started until their first request) against its later wake-ups."""
    requests = [r["swap"] for r in swaps.get("requests", []) if r["swap"].get("ok") and r["swap"].get("swap")]
    cold = [r for r in requests if r.get("wake_kind") == "cold_start"]
    warm = [r for r in requests if r.get("wake_kind") != "cold_start"]
    section = {
        "cold_starts": [{k: r.get(k) for k in ("model", "ttft_s", "wake_s")} for r in cold],
        "cold_start_wake_s": summary([r["wake_s"] for r in cold if r.get("wake_s") is not None]),
        "wake_up_wake_s": summary([r["wake_s"] for r in warm if r.get("wake_s") is not None]),
    }
    if not gpu:
        section["note"] = (
            "CPU: vLLM's CPU platform has no sleep mode, so an engine sleeps by stopping and every wake is a "
            "cold start (engine build, weights load, warm-up): the swap figures are cold starts"
        )
    else:
        section["note"] = (
            "GPU: the engine beyond the plan's awake set starts unstarted, so its first wake here is a fresh "
            "engine start (cold_start); every later wake is vLLM's wake_up"
        )
    return section


def run(profile_path: Path, out: Path, swaps: int, cycles: int, timeout_s: float) -> dict:
    from bench.harness.stack import poolserve_stack
    from planner.plan import build_plan
    from planner.profile import load_profile
    from stackctl.launcher import StackLayout
    from stackctl.processes import stack_pids

    out.mkdir(parents=True, exist_ok=True)
    profile = load_profile(profile_path)
    name = profile.name
    result_path, log_path = out / f"on-demand-{name}.json", out / f"on-demand-{name}.log"
    log_file = log_path.open("a")

    def log(message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    report: dict = {"profile": str(profile_path), "swaps_asked": swaps, "cycles_asked": cycles, "steps": {}}

    def save() -> None:
        result_path.write_text(json.dumps(report, indent=1, default=str))

    def step(title: str, fn: Callable[[], dict]) -> dict | None:
        started = time.perf_counter()
        log(f"{title}: start")
        try:
            value = fn()
            report["steps"][title] = {"ok": True, "seconds": round(time.perf_counter() - started, 2)}
            report[title] = value
            report.pop(f"{title}_so_far", None)  # the whole section replaces what progress() kept
        except Exception as exc:
            value = None
            report["steps"][title] = {
                "ok": False,
                "seconds": round(time.perf_counter() - started, 2),
                "error": f"{type(exc).__name__}: {str(exc)[:800]}",
            }
        log(f"{title}: {report['steps'][title]}")
        save()
        return value

    admin_key = os.environ.setdefault("POOLSERVE_ADMIN_KEY", secrets.token_urlsafe(24))
    plan = build_plan(profile)
    if plan.on_demand is None or len(plan.on_demand.engines) < 2:
        raise SystemExit(f"{profile_path}: the bench needs two on-demand engines")
    pool = profile.pools[0]
    discrete = pool.gpu and not pool.unified
    report["plan"] = {
        "pool_total_bytes": plan.pool.total_bytes,
        "max_awake": plan.on_demand.max_awake,
        "worst_awake_set": plan.on_demand.worst_awake_set,
        "engines": plan_engines(plan),
    }
    warnings = []
    if plan.on_demand.max_awake != 1:
        warnings.append("max_awake_on_demand is not 1: requests may not need swaps")
    # The bench is one tenant that causes every wake: its private stack lets that tenant make the run's wakes (the
    # budget itself is tested in tests/unit/planner/test_wake_ledger.py and test_wake_coordinator.py), and the report says so.
    over = wakes_over_budget(report["plan"]["engines"], swaps, cycles)
    on_demand_overrides = None
    if over:
        wakes = wakes_in_run(swaps, cycles)
        on_demand_overrides = {"tenant_wakes_per_hour": wakes}
        report["tenant_wakes_per_hour_raised"] = {"engines": over, "to": wakes}
        log(f"tenant_wakes_per_hour of {', '.join(over)} raised to {wakes} for this run")
    if warnings:
        report["warnings"] = warnings
        for warning in warnings:
            log(f"warning: {warning}")
    sampler = None
    if discrete:
        from bench.bench_gpu_plan import wait_gpu_empty
        from bench.gpu_probe import GpuSampler

        sampler = GpuSampler().__enter__()
        report["device"], report["gpu_total_bytes"] = sampler.device_name(), sampler.total()
        baseline = sampler.read().used
    else:
        report["device"] = "cpu"
    workdir = Path(tempfile.mkdtemp(prefix="on-demand-"))
    report["workdir"] = str(workdir)
    state_dir = workdir / "state"

    def keep_serve_log() -> None:
        """The stack's log beside the results: after the swaps too, so a run the device time cuts short keeps each
        engine's first sleep (what it holds outside the sleep pool)."""
        serve_log = workdir / "serve.log"
        if serve_log.exists():
            shutil.copy(serve_log, out / f"on-demand-{name}-serve.log")

    save()
    started = time.time()
    try:
        with poolserve_stack(
            profile_path, workdir, timeout_s=timeout_s, on_demand_overrides=on_demand_overrides
        ) as server:
            report["start_to_healthy_s"] = round(time.time() - started, 1)
            log(f"healthy in {report['start_to_healthy_s']} s at {server.base_url}")

            saved_at = time.monotonic()

            def progress(section: str, record: dict) -> None:
                # the whole report is written again each time (36 ms at 852 cycles): at most once in PROGRESS_SAVE_S
                nonlocal saved_at
                report.setdefault(f"{section}_so_far", []).append(record)
                if time.monotonic() - saved_at >= PROGRESS_SAVE_S:
                    save()
                    saved_at = time.monotonic()

            bench = Bench(server, admin_key, plan, sampler, log, progress)
            step("at_start", bench.start)
            step("metrics_before", bench.metrics)
            step("memory_at_start", bench.probe.read)
            swapped = step("swaps", lambda: bench.swaps(swaps)) or {}
            report["cold_start"] = cold_start_section(swapped, discrete)
            keep_serve_log()
            if cycles:
                step("cycles", lambda: bench.cycles(cycles))
            step("metrics_after", bench.metrics)
            step("models_after", bench.states)
            if report.get("metrics_before") and report.get("metrics_after"):
                report["metrics_delta"] = metrics_delta(report["metrics_before"], report["metrics_after"])
            save()
            log("stopping the stack (poolserve down)")
    except Exception as exc:  # a failed start or a stop that left processes is a result too
        report["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        log(f"error: {report['error']}")
    left = stack_pids(StackLayout(state_dir).stack_id)
    report["after_down"] = {"stack_processes_left": left, "clean": not left}
    if sampler is not None:
        report["after_down"]["gpu"] = wait_gpu_empty(sampler, baseline)
        report["after_down"]["clean"] = not left and report["after_down"]["gpu"]["empty"]
        sampler.__exit__(None, None, None)
        weights = max((e["level_1_weight_bytes"] for e in report["plan"]["engines"].values()), default=0)
        if weights and step("host_to_device_copy", lambda: host_to_device_copy(weights)):
            report["wake_against_copy"] = wake_against_copy(
                report.get("cold_start", {}).get("wake_up_wake_s"), report["host_to_device_copy"]
            )
    keep_serve_log()
    report["seconds"] = round(time.time() - started, 1)
    save()
    log(f"done: {result_path}")
    log_file.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=Path("configs/gpu-on-demand.yaml"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--swaps", type=int, default=20, help="swap requests, alternating between two models")
    parser.add_argument("--cycles", type=int, default=0, help="endurance: sleep/wake cycles of one engine")
    parser.add_argument("--timeout", type=float, default=560, help="seconds for the stack to become healthy")
    args = parser.parse_args()
    report = run(args.profile, args.out, args.swaps, args.cycles, args.timeout)
    swaps = report.get("swaps") or {}
    print(
        json.dumps(
            {
                "device": report.get("device"),
                "start_to_healthy_s": report.get("start_to_healthy_s"),
                "swap_ttft_s": swaps.get("swap_ttft_s"),
                "swap_ttft_s_by_wake_kind": swaps.get("swap_ttft_s_by_wake_kind"),
                "no_swap_ttft_s": swaps.get("no_swap_ttft_s"),
                "requests_failed": swaps.get("requests_failed"),
                "cold_start": report.get("cold_start"),
                "endurance": {k: v for k, v in (report.get("cycles") or {}).items() if k != "per_cycle"},
                "steps": report.get("steps"),
                "error": report.get("error"),
                "after_down": report.get("after_down"),
            },
            indent=1,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
