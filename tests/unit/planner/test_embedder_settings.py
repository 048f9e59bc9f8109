"""The embedder replica is bound with one typed, frozen section of the plan (issue 47), built from the profile."""

import pytest
from pydantic import ValidationError

from planner.plan import build_plan
from planner.profile import load_profile


def test_the_plan_carries_everything_the_embedder_reads():
    profile = load_profile("configs/cpu-tiny.yaml")
    profile.embedder.query_prefix = "query: "
    plan = build_plan(profile)
    settings = plan.embedder
    assert settings.model_path == str(profile.embedder.model) and settings.model_id == profile.embedder.model_id
    assert (settings.chunk_tokens, settings.chunk_overlap) == (profile.rag.chunk_tokens, profile.rag.chunk_overlap)
    assert settings.device == "cpu" and settings.query_prefix == "query: "
    assert settings.ingest_threads == plan.threads["embedder_ingest_most"] >= settings.torch_threads
    with pytest.raises(ValidationError):
        settings.batch_size = 1  # frozen: what the replica was bound with is what the plan said


def test_a_gpu_share_means_cuda():
    plan = build_plan(load_profile("configs/h100.yaml"), 81_559 * 2**20)
    assert plan.embedder.device == "cuda" and plan.replica("embedder").ray_actor_options.num_gpus
