"""Each tenant's prompts live in their own prefix-cache namespace (vLLM's cache_salt)."""

from __future__ import annotations

from types import SimpleNamespace

from deployments.gateway import Gateway
from gateway.middleware.tenant_guard import TENANT_KEY


def _salted(tenant: str, client_salt: str | None = None) -> str:
    body = SimpleNamespace(cache_salt=client_salt)
    Gateway._salt(body, SimpleNamespace(scope={TENANT_KEY: SimpleNamespace(name=tenant)}))
    return body.cache_salt


def test_tenants_get_different_salts_and_the_same_tenant_the_same_one():
    assert _salted("alpha") == _salted("alpha")
    assert _salted("alpha") != _salted("beta")


def test_a_client_cannot_choose_another_tenants_namespace():
    # Whatever salt beta sends, it never lands in alpha's namespace (nor in its own default one).
    alpha = _salted("alpha")
    for attempt in (alpha, "alpha", "", None, "x" * 64):
        assert _salted("beta", attempt) != alpha
    assert _salted("beta", "mine") != _salted("beta")
    assert _salted("beta", "mine") == _salted("beta", "mine")


def test_salt_is_accepted_by_vllm_validation_whatever_the_client_sent():
    import pytest
    from vllm.entrypoints.generate.base.protocol import validate_cache_salt
    from vllm.exceptions import VLLMValidationError

    # vLLM refuses an empty salt, one over 128 characters, or one with '@', '/', '\\' or NUL; the salt the
    # gateway sets is valid even when the client's own salt is none of those (it is hashed into ours).
    with pytest.raises(VLLMValidationError):
        validate_cache_salt("a/b")
    for client_salt in (None, "client", "a/b@c", "x" * 500, "\x00"):
        salt = _salted("alpha", client_salt)
        assert isinstance(salt, str) and 0 < len(salt) <= 128
        assert validate_cache_salt(salt) is None
