"""The retriever replica is bound with one typed, frozen section of the plan (issue 47), built from the profile."""

import pytest
from pydantic import ValidationError

from planner.plan import build_plan
from planner.profile import load_profile
from deployments.retriever import _quotas


def test_the_plan_carries_everything_the_retriever_reads():
    profile = load_profile("configs/cpu-tiny.yaml")
    profile.retriever.tenant_max_chunks = 5000
    profile.retriever.tenant_quotas = {"acme": {"chunks": 90_000, "documents": None}}
    profile.rag.fusion.dense_weight = 0.55
    settings = build_plan(profile).retriever
    assert settings.state_dir == profile.state_dir and settings.index_kind == profile.retriever.index
    assert settings.dim == 384 and settings.embedder_model_id == profile.embedder.model_id
    assert settings.fusion.dense_weight == 0.55
    quotas = _quotas(settings)
    assert quotas.default.chunks == 5000 and quotas.default.documents is None
    assert quotas.of("acme").chunks == 90_000 and quotas.of("other").chunks == 5000
    with pytest.raises(ValidationError):
        settings.faiss_threads = 8  # frozen: what the replica was bound with is what the plan said
