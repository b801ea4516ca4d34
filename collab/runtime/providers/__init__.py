"""Model providers behind one interface: ``complete(turn) -> ModelResponse``."""

from collab.provider_specs import IMPLEMENTED_PROVIDERS
from collab.runtime.providers.base import ModelResponse, ProviderError, ToolCall
from collab.runtime.providers.scripted import ScriptedProvider


def get_provider(spec):
    provider = getattr(spec, "provider", "scripted") or "scripted"
    if provider == "scripted":
        return ScriptedProvider(getattr(spec, "script", None) or [])
    if provider == "openai":
        # lazy: the openai SDK takes a second or more to import; only a process running an openai spec needs it
        from collab.runtime.providers.openai_provider import OpenAIProvider

        return OpenAIProvider(spec)
    if provider == "anthropic":
        # lazy: the anthropic SDK takes seconds to import; only a process running an anthropic spec needs it
        from collab.runtime.providers.anthropic_provider import AnthropicProvider

        return AnthropicProvider(spec)
    raise ProviderError(f"provider {provider!r} is not available on this server", code="provider_unavailable")


__all__ = ["IMPLEMENTED_PROVIDERS", "ModelResponse", "ProviderError", "ToolCall", "get_provider"]
