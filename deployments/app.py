"""The app builder `serve.yaml` points at: profile -> plan -> deployments.

`serve run serve.yaml` calls `build_app({"profile": ...})`. The planner refuses a profile that
does not fit before any replica starts; every number below comes from its plan.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from pydantic import BaseModel, Field
from ray import serve

from vllm_bridge.compat import build_llm_deployment, make_fastapi_ingress, to_model_metadata
from gateway.http_app import ENDPOINTS, make_app
from planner.plan import WAKE_COORDINATOR, Plan, resolved_plan
from planner.profile import Profile, load_profile
from deployments.chat import PoolserveLLMServer, llm_config_from_plan
from deployments.embedder import Embedder
from deployments.gateway import Gateway
from deployments.retriever import Retriever
from deployments.wake_coordinator import WakeCoordinator
from deployments.start_order import StartOrder
from system.private_files import make_private_dir
from system.ray_exposure import exposure

logger = logging.getLogger("poolserve.app")


class AppArgs(BaseModel):
    model_config = {"extra": "forbid"}
    profile: str = Field(
        default_factory=lambda: os.environ.get("POOLSERVE_PROFILE", "configs/cpu-tiny.yaml"),
        description="Profile YAML, relative to the working directory; default $POOLSERVE_PROFILE, "
        "else the CPU default.",
    )
    plan: dict | None = Field(
        None,
        description="The resolved Plan (`poolserve up` and `poolserve render` write "
        "it): deployed as it is, after a check that it is this profile's. None: plan at start.",
    )


def _options(plan, name: str) -> dict:
    return plan.replica(name).serve_options()


OPEN_RAY_GRACE_S = 5.0  # the refusal reaches the terminal of `serve run` (Ray's log monitor) before it is ended


def refuse_if_ray_is_open(profile: Profile) -> None:
    """Fail closed: refuse to deploy on a Ray cluster others can reach (system/ray_exposure.py). Plain `serve run
    serve.yaml` starts Ray with its defaults (every interface, no private token); the `serve run` that started
    such a Ray itself is ended after the refusal is logged, and with it that Ray."""
    if profile.ray.allow_open:
        return
    found = exposure()
    problem = found.problem(several_nodes=len(profile.pools) > 1)
    if problem is None:
        return
    message = (
        f"refusing to deploy: the Ray cluster this app runs in is open: {problem}. Anyone who reaches it "
        "can run code as this user. Start the stack with `poolserve up serve.yaml` (make serve): a private "
        "Ray on loopback with token authentication. To deploy on this Ray on purpose (a cluster closed by "
        "other means), set `ray.allow_open: true` in the profile (docs/SECURITY.md)."
    )
    logger.error(message)
    if found.started_by:
        logger.error("ending the `serve run` (pid %d) that started this Ray, and with it the Ray", found.started_by)
        threading.Timer(OPEN_RAY_GRACE_S, os.kill, (found.started_by, signal.SIGTERM)).start()
    raise RuntimeError(message)


def engine_deployments(profile: Profile, plan: Plan) -> tuple[dict, dict, list[tuple[str, str]]]:
    """Every chat engine's deployment and model card by model id, each engine to start after the engines of
    the start order before its own (those of one order start together), and what the rest waits for (the
    health checks of the last order's engines)."""
    llm_deployments, model_cards, after, current, order, waves = {}, {}, [], [], None, []
    for name, spec in profile.chat_engines():
        replica = plan.replica(name)
        if order is None or replica.start_order != order:
            if order is not None:
                after, current = current, []
            waves.append([])
        order = replica.start_order
        rank_plans = sorted(
            (r for r in plan.shares if r.name.startswith(f"{name}@") and r.engine_node_rank is not None),
            key=lambda r: r.engine_node_rank,
        )
        on_demand = plan.on_demand.engines.get(name) if plan.on_demand else None
        start_asleep = on_demand is not None and name not in plan.on_demand.worst_awake_set
        llm_config = llm_config_from_plan(spec, replica, after, rank_plans, on_demand, start_asleep)
        engine = build_llm_deployment(llm_config, deployment_cls=PoolserveLLMServer)
        llm_deployments[spec.model_id] = engine
        model_cards[spec.model_id] = to_model_metadata(spec.model_id, llm_config)
        current.append((engine._bound_deployment.name, "check_health"))
        waves[-1].append(engine._bound_deployment.name)
    logger.info("start order: %s, then embedder, retriever and gateway", " -> ".join(" + ".join(w) for w in waves))
    return llm_deployments, model_cards, current


def _start_order(plan: Plan, name: str, after: list[tuple[str, str]]) -> StartOrder:
    return StartOrder(after, plan.replica(name).serve.start_wait_timeout_s)


def embedder_deployment(plan: Plan, start_after: list[tuple[str, str]]) -> serve.Application:
    """The embedder bound with its plan: resources, and the settings (the device among them) that go with them."""
    return Embedder.options(**_options(plan, "embedder")).bind(
        plan.embedder, _start_order(plan, "embedder", start_after)
    )


def build_app(args: dict) -> serve.Application:
    parsed = AppArgs.model_validate(args or {})
    profile = load_profile(os.path.abspath(parsed.profile))
    refuse_if_ray_is_open(profile)  # first: a refused stack plans nothing and leaves no state behind
    plan = resolved_plan(profile, parsed.plan)
    os.umask(0o077)  # databases, keys and snapshots this process creates are the owner's only
    make_private_dir(profile.state_dir)
    logger.info("plan for %s: %s", profile.name, {r.name: r.planned_bytes for r in plan.replicas})

    # Ordered start: the engines one at a time (each after the previous one has allocated its KV cache and
    # answered its warm-up) or, on a CPU, together (PoolSpec.engines_start), then everything else.
    llm_deployments, model_cards, after_engines = engine_deployments(profile, plan)
    embedder = embedder_deployment(plan, after_engines)
    retriever = Retriever.options(**_options(plan, "retriever")).bind(
        plan.retriever, _start_order(plan, "retriever", after_engines)
    )
    app = make_app(plan.edge)
    ingress_cls = make_fastapi_ingress(Gateway, endpoint_map=ENDPOINTS, app=app)
    gateway = serve.deployment(ingress_cls, name="gateway").options(**_options(plan, "gateway"))
    wake = None
    if plan.on_demand is not None:  # issue 48: one wake coordinator for the pool's on-demand engines
        wake = WakeCoordinator.options(**_options(plan, WAKE_COORDINATOR)).bind(
            plan.on_demand, {e.model_id: llm_deployments[e.model_id] for e in plan.on_demand.engines.values()}
        )
    return gateway.bind(
        llm_deployments=llm_deployments,
        model_cards=model_cards,
        embedder=embedder,
        retriever=retriever,
        settings=plan.gateway,
        start=_start_order(plan, "gateway", after_engines),
        wake=wake,
    )
