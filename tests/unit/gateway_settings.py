"""A whole GatewaySettings for the gateway stand-ins of the unit tests: the profile's defaults, with the
fields a test cares about given by name."""

from __future__ import annotations

from planner.outputs import GatewaySettings
from planner.profile import GatewaySpec, RagSpec


def gateway_settings(**fields) -> GatewaySettings:
    spec = GatewaySpec()
    defaults = {**RagSpec().model_dump(), "chat_model_id": "chat-model", "chat_models": {}, "embed_model_id": "embedder",
                "planned_bytes": {}, "planned_at_rest_bytes": {}, "max_choices": spec.max_choices,
                "max_prompts": spec.max_prompts, "max_embedding_inputs": spec.max_embedding_inputs,
                "unavailable_retry_after_s": 10, "cookie_secure": spec.cookie_secure,
                "trust_forwarded_proto": spec.trust_forwarded_proto, "embed_max_seq_tokens": 256,
                "state_dir": "var"}
    return GatewaySettings.model_validate({**defaults, **fields})
