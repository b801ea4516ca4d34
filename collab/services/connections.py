"""Operator-owned model connections (docs/contract.md#authorization-and-visibility): which one a spec may use, and the
settings-defined ones mirrored into the table.

One rule, ``connection_problem``, decides whether a connection serves a spec's project,
provider and model; spec creation (400 ``provider_config``) and the worker before every
model call (``ProviderError`` ``provider_config``) both ask it, since a binding can change
between the two.

Connections from ``settings.TRELLIS_MODEL_CONNECTIONS`` are synced into the table *on use*
(``sync_settings_connections``, called before a connection is chosen or checked): every
process applies the settings it runs with, a project created after start-up is bound as
soon as a spec asks, and nothing depends on a start-up hook having run against a migrated
database. The sync reads a few rows and writes only what differs. A settings connection
that disappears from the setting is disabled and unbound (specs may still point at it; their
turns fail with ``provider_config``).
"""

import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from accounts.models import Project
from collab.errors import Invalid
from collab.models import ConnectionSource, ModelConnection

log = logging.getLogger(__name__)

SYNCED_FIELDS = ("provider", "base_url", "key_env", "allowed_models", "prices", "all_projects", "enabled", "source")


def sync_settings_connections() -> None:
    """Make the rows of source ``settings`` match ``settings.TRELLIS_MODEL_CONNECTIONS``."""
    wanted = {c["name"]: c for c in getattr(settings, "TRELLIS_MODEL_CONNECTIONS", None) or []}
    rows = {
        c.name: c for c in ModelConnection.objects.filter(Q(source=ConnectionSource.SETTINGS) | Q(name__in=wanted))
        .prefetch_related("projects")
    }
    if not wanted and not rows:
        return
    slugs = {slug for c in wanted.values() for slug in c["projects"]}
    project_ids = dict(Project.objects.filter(slug__in=slugs).values_list("slug", "pk")) if slugs else {}
    for name, conf in wanted.items():
        fields = {k: conf[k] for k in ("provider", "base_url", "key_env", "allowed_models", "prices", "all_projects")}
        fields.update(enabled=True, source=ConnectionSource.SETTINGS)
        ids = {project_ids[s] for s in conf["projects"] if s in project_ids}
        _apply(name, rows.get(name), fields, ids)
    for name, row in rows.items():
        if name not in wanted and row.source == ConnectionSource.SETTINGS:
            _apply(name, row, {"enabled": False, "all_projects": False}, set())


def _apply(name: str, row, fields: dict, project_ids: set) -> None:
    if row is not None:
        same = all(getattr(row, k) == v for k, v in fields.items())
        if same and {p.pk for p in row.projects.all()} == project_ids:
            return
        if row.source == ConnectionSource.ADMIN and fields.get("source") == ConnectionSource.SETTINGS:
            log.warning("model connection %r is defined in TRELLIS_MODEL_CONNECTIONS; the setting replaces the admin's", name)
    try:
        with transaction.atomic():
            conn = ModelConnection.objects.select_for_update().filter(name=name).first()
            if conn is None:
                conn = ModelConnection.objects.create(name=name, **fields)
            else:
                for k, v in fields.items():
                    setattr(conn, k, v)
                conn.save()
            conn.projects.set(project_ids)
    except IntegrityError:  # another process created it at the same moment; the next use re-checks
        log.info("model connection %r was synced by another process", name)


def connection_problem(connection, *, project_id, provider: str, model: str) -> str | None:
    """Why ``connection`` cannot serve a spec of ``project_id`` on ``provider`` with ``model``,
    or None when it can. Reasons name the connection, never its URL or key variable."""
    if connection is None:
        return f"no model connection is set for this {provider} agent (an operator assigns one)"
    if not connection.enabled:
        return f"model connection {connection.name!r} is disabled"
    if connection.provider != provider:
        return f"model connection {connection.name!r} is for {connection.provider}, not {provider}"
    if not connection.all_projects and not connection.projects.filter(pk=project_id).exists():
        return f"model connection {connection.name!r} is not available to this project"
    if connection.allowed_models and model not in connection.allowed_models:
        return f"model {model!r} is not allowed on connection {connection.name!r}"
    return None


def usable_connections(project, provider: str):
    """The enabled connections of ``provider`` that ``project`` may use."""
    return (ModelConnection.objects.filter(provider=provider, enabled=True)
            .filter(Q(all_projects=True) | Q(projects=project)).distinct().order_by("name"))


def connections_for(project, *, sync: bool = True):
    """Every enabled connection ``project`` may use, of any provider (the spec page's choice),
    settings-defined ones synced first unless the caller just did."""
    if sync:
        sync_settings_connections()
    return (ModelConnection.objects.filter(enabled=True).filter(Q(all_projects=True) | Q(projects=project))
            .distinct().order_by("provider", "name"))


def _same_url(a: str, b: str) -> bool:
    return (a or "").strip().rstrip("/") == (b or "").strip().rstrip("/")


def choose_connection(project, *, provider: str, model: str, connection: str = "", base_url: str = "",
                      api_key_env: str = ""):
    """The connection a new spec uses, or None for the scripted provider.

    ``connection`` names it; the older ``base_url``/``api_key_env`` fields are accepted only
    when they match exactly one connection this project may use (an empty ``base_url`` is
    the provider's official API; an empty ``api_key_env`` matches any key variable).
    Anything else is refused with ``provider_config``: a tenant cannot name a host or a
    variable the operator did not list for their project."""
    connection, base_url, api_key_env = (connection or "").strip(), (base_url or "").strip(), (api_key_env or "").strip()
    if provider == "scripted":
        if connection or base_url or api_key_env:
            raise Invalid("the scripted provider takes no connection, base_url or api_key_env", code="provider_config")
        return None
    sync_settings_connections()
    usable = list(usable_connections(project, provider))
    if connection:
        found = next((c for c in usable if c.name == connection), None)
        if found is None:
            raise Invalid(f"no {provider} model connection named {connection!r} is available to this project",
                          code="provider_config")
        if (base_url and not _same_url(base_url, found.base_url)) or (api_key_env and api_key_env != found.key_env):
            raise Invalid(f"base_url/api_key_env do not match model connection {connection!r}; send only the connection",
                          code="provider_config")
    else:
        matches = [c for c in usable if _same_url(base_url, c.base_url) and (not api_key_env or api_key_env == c.key_env)
                   and connection_problem(c, project_id=project.pk, provider=provider, model=model) is None]
        if len(matches) != 1:
            what = "several model connections match" if matches else "no model connection available to this project matches"
            raise Invalid(f"{what} this {provider} base_url/api_key_env; name one with the connection field "
                          "(connections are defined by the operator)", code="provider_config")
        found = matches[0]
    problem = connection_problem(found, project_id=project.pk, provider=provider, model=model)
    if problem:
        raise Invalid(problem, code="provider_config")
    return found


def check_spec_connection(spec):
    """The worker's check before a model call: the spec's connection, read fresh, still
    serves it. Returns the connection; raises ``Invalid`` (``provider_config``) otherwise."""
    sync_settings_connections()
    connection = ModelConnection.objects.filter(pk=spec.connection_id).first() if spec.connection_id else None
    problem = connection_problem(connection, project_id=spec.project_id, provider=spec.provider, model=spec.model)
    if problem:
        raise Invalid(problem, code="provider_config")
    return connection


def do_register_connection(name: str, *, provider: str, base_url: str, key_env: str = "", project=None,
                           allowed_models: list | None = None) -> ModelConnection:
    """Create or update an admin-source connection (operators' commands, e.g. ``local_model``)
    and bind it to ``project``. A settings-defined connection of that name is left alone."""
    with transaction.atomic():
        conn = ModelConnection.objects.select_for_update().filter(name=name).first()
        if conn is not None and conn.source == ConnectionSource.SETTINGS:
            raise Invalid(f"model connection {name!r} is defined in TRELLIS_MODEL_CONNECTIONS", code="provider_config")
        fields = {"provider": provider, "base_url": base_url, "key_env": key_env, "enabled": True,
                  "allowed_models": list(allowed_models or [])}
        if conn is None:
            conn = ModelConnection.objects.create(name=name, **fields)
        else:
            for k, v in fields.items():
                setattr(conn, k, v)
            conn.save()
        if project is not None:
            conn.projects.add(project)
    return conn
