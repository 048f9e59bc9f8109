"""The gateway's settings for the stand-ins of the unit tests: a whole GatewaySettings (the profile's defaults,
with the fields a test cares about given by name) and the outer settings of an app built without a plan."""

from __future__ import annotations

from planner.outputs import FROM_GATEWAY_SPEC, GatewaySettings
from planner.profile import GatewaySpec, RagSpec


def gateway_settings(**fields) -> GatewaySettings:
    defaults = {
        **RagSpec().model_dump(),
        **GatewaySpec().model_dump(include=set(FROM_GATEWAY_SPEC)),
        "chat_model_id": "chat-model",
        "chat_models": {},
        "embed_model_id": "embedder",
        "planned_bytes": {},
        "planned_at_rest_bytes": {},
        "embed_max_seq_tokens": 256,
        "state_dir": "var",
    }
    return GatewaySettings.model_validate({**defaults, **fields})


def unplanned_edge(state_dir, gateway: dict | None = None):
    """The gateway's outer settings for an app built alone (no plan): the schema's fixed guard marks and the
    profile schema's gateway section with `gateway`'s fields over it."""
    from planner.guard import unplanned_guard
    from planner.outputs import GatewayEdge
    from planner.profile import GatewaySpec

    return GatewayEdge(
        state_dir=str(state_dir),
        tenants_file=None,
        guard=unplanned_guard(),
        gateway=GatewaySpec.model_validate(gateway or {}),
    )
