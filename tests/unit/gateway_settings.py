"""A whole GatewaySettings for the gateway stand-ins of the unit tests: the profile's defaults, with the
fields a test cares about given by name."""

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
