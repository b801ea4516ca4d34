"""``TRELLIS_MODEL_CONNECTIONS``: operator-defined model connections, parsed loudly.

The variable holds a JSON list of objects::

    [{"name": "openai", "provider": "openai", "key_env": "OPENAI_API_KEY",
      "allowed_models": ["gpt-4.1-mini"], "all_projects": true},
     {"name": "local-vllm", "provider": "openai", "base_url": "http://10.0.0.5:8000/v1",
      "projects": ["research"], "prices": {"llama-3-70b": [0.5, 0.8]}}]

``name`` and ``provider`` are required; ``base_url`` (http/https; empty = the provider's
official API), ``key_env`` (a worker environment variable; empty = keyless),
``allowed_models`` (empty = any), ``prices`` ({model: [input, output]} $ per million
tokens), ``all_projects`` and ``projects`` (project slugs) are optional. Any other key, a
bad value or a repeated name stops the process at start-up (``ImproperlyConfigured``).
"""

import json
import os
import re
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

PROVIDERS = ("openai", "anthropic")
FIELDS = {"name", "provider", "base_url", "key_env", "allowed_models", "prices", "all_projects", "projects"}
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
KEY_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def check_base_url(url: str) -> str | None:
    """Why ``url`` cannot be a connection's base URL, or None if it can (empty = official API)."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username or parts.password:
        return "must not carry credentials (name the key's variable in key_env)"
    return None


def check_prices(prices) -> str | None:
    if not isinstance(prices, dict):
        return 'must be an object like {"model": [input, output]}'
    for model, pair in prices.items():
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(p, (int, float)) and not isinstance(p, bool) and p >= 0 for p in pair)):
            return f"{model!r} must map to [input, output] non-negative numbers ($ per million tokens)"
    return None


def _connection(n: int, item, var: str) -> dict:
    where = f"{var}[{n}]"
    if not isinstance(item, dict):
        raise ImproperlyConfigured(f"{where} must be an object")
    unknown = set(item) - FIELDS
    if unknown:
        raise ImproperlyConfigured(f"{where} has unknown keys {sorted(unknown)}; allowed: {sorted(FIELDS)}")

    def text(key, default=""):
        value = item.get(key, default)
        if not isinstance(value, str):
            raise ImproperlyConfigured(f"{where}.{key} must be a string")
        return value.strip()

    def names(key):
        value = item.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise ImproperlyConfigured(f"{where}.{key} must be a list of non-empty strings")
        return [v.strip() for v in value]

    name = text("name")
    if not NAME_RE.fullmatch(name):
        raise ImproperlyConfigured(f"{where}.name must be a slug (a-z, 0-9, - and _), got {name!r}")
    provider = text("provider")
    if provider not in PROVIDERS:
        raise ImproperlyConfigured(f"{where}.provider must be one of {PROVIDERS}, got {provider!r}")
    base_url = text("base_url")
    problem = check_base_url(base_url)
    if problem:
        raise ImproperlyConfigured(f"{where}.base_url {problem}")
    key_env = text("key_env")
    if key_env and not KEY_ENV_RE.fullmatch(key_env):
        raise ImproperlyConfigured(f"{where}.key_env must be an environment variable name, got {key_env!r}")
    prices = item.get("prices", {})
    problem = check_prices(prices)
    if problem:
        raise ImproperlyConfigured(f"{where}.prices: {problem}")
    all_projects = item.get("all_projects", False)
    if not isinstance(all_projects, bool):
        raise ImproperlyConfigured(f"{where}.all_projects must be true or false")
    return {
        "name": name, "provider": provider, "base_url": base_url, "key_env": key_env,
        "allowed_models": names("allowed_models"),
        "prices": {m: [float(p[0]), float(p[1])] for m, p in prices.items()},
        "all_projects": all_projects, "projects": names("projects"),
    }


def model_connections_from_env(var: str = "TRELLIS_MODEL_CONNECTIONS") -> list[dict]:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return []
    try:
        items = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{var} must be a JSON list of connection objects: {exc}") from None
    if not isinstance(items, list):
        raise ImproperlyConfigured(f"{var} must be a JSON list of connection objects")
    connections = [_connection(n, item, var) for n, item in enumerate(items)]
    seen = set()
    for c in connections:
        if c["name"] in seen:
            raise ImproperlyConfigured(f"{var} names the connection {c['name']!r} twice")
        seen.add(c["name"])
    return connections
