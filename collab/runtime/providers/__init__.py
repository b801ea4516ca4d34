"""Model providers behind one interface: ``complete(ctx) -> ModelResponse``."""

from collab.runtime.providers.base import ModelResponse, ProviderError, ToolCall


def get_provider(spec):
    provider = getattr(spec, "provider", "scripted") or "scripted"
    if provider == "scripted":
        from collab.runtime.providers.scripted import ScriptedProvider

        return ScriptedProvider(getattr(spec, "script", None) or [])
    raise ProviderError(f"provider {provider!r} is not available on this server", code="provider_unavailable")


IMPLEMENTED_PROVIDERS = ("scripted",)

__all__ = ["IMPLEMENTED_PROVIDERS", "ModelResponse", "ProviderError", "ToolCall", "get_provider"]
