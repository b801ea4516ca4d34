"""Statements compiled once per process (toward ≥ 100 turns/s with two workers).

Django builds and compiles a queryset again at every call: ~0.5–1 ms of Python per statement,
most of a turn's CPU in the web process and the worker. The hot statements (the token's and the
access layer's reads, the claim, the completion, their locks) are compiled here by Django's own
compiler once per process and *shape*, and run again with new values bound to the same SQL (which PostgreSQL, with
server-side binding, also parses and plans once: ``DB_PREPARE_THRESHOLD``).

- A value that varies from call to call is a ``Param``: an expression that compiles to one
  placeholder, filled when the statement runs. Everything else a builder puts in its queryset is
  part of the SQL, the same every time.
- A statement is a ``Select`` or an ``Update`` (a conditional ``UPDATE … RETURNING``, as
  ``collab.services.locking.update_returning``): a name and a builder. ``build(*shape)`` makes the
  queryset from the shape alone — the few things that change the SQL (whether a cap applies, which
  statuses a job may leave) — never from the values; the cache key is (name, *shape).
- The cache belongs to the process, keyed by the database's alias and vendor (PostgreSQL and
  SQLite have SQL of their own): a statement compiled on one connection runs on any other of
  that alias, in any thread — under ASGI each request may hold a connection object of its own,
  and a pool hands out a different raw connection each time. Rows are converted with the
  connection that ran the statement.

What a cached statement does is what the queryset did: the same SQL, rows converted as the ORM
converts them (field converters, ``select_related`` rows, annotations), ``select_for_update``
refused outside a transaction.
"""

import datetime
import re
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Expression
from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesListIterable, get_related_populators
from django.db.models.sql import InsertQuery, UpdateQuery
from django.db.transaction import TransactionManagementError
from psycopg import sql as psycopg_sql

# the values of a statement that runs through the ORM instead of its cached SQL (an old SQLite
# without RETURNING): Params compile to the values themselves there
_bound: ContextVar[dict | None] = ContextVar("prepared_bound", default=None)


class Param(Expression):
    """A value given when the statement runs (``values[name]``): one placeholder in the SQL.

    ``output_field``: the field whose preparation the value passes (``get_db_prep_value``, or
    ``get_db_prep_save`` in an UPDATE's SET), as a ``Value`` of that field would; needed where
    the value is not one the driver takes as it is (a duration, a decimal on SQLite). Without it
    the value goes to the driver unchanged: ids, numbers, text, booleans, None. An ``Update``
    gives a Param that is a SET value its column's field."""

    def __init__(self, name: str, output_field=None, *, fixed=None):
        super().__init__(output_field=output_field)
        self.name, self.fixed = name, fixed
        self.for_save = False

    @classmethod
    def hidden(cls, name: str, value) -> "Param":
        """A constant the planner must not see: bound at every run as a parameter (never written
        into the SQL as the other constants are), so that no partial index can be proven from
        it. For a primary-key lookup guarded by a status (``id = … AND status = 'queued'``):
        with the status in the SQL, a generic plan may scan the partial index of that status —
        every queued job — for the one id, a plan made while the queue was short and kept
        while it is long (``bench/turns.py``: ~65 index entries read per claim)."""
        if value is None:
            raise TypeError(f"a hidden constant has a value: {name!r}")  # None is a Param's "no fixed value"
        return cls(name, fixed=value)

    def __repr__(self):
        return f"Param({self.name!r})"

    def resolve_expression(self, query=None, allow_joins=True, reuse=None, summarize=False, for_save=False):
        resolved = super().resolve_expression(query, allow_joins, reuse, summarize, for_save)
        resolved.for_save = for_save
        return resolved

    def get_group_by_cols(self):
        return []

    def as_sql(self, compiler, connection):
        slot = _Slot(self.name, self._output_field_or_none, self.for_save, self.fixed)
        bound = _bound.get()
        return "%s", [slot.value(bound, connection) if bound is not None else slot]


@dataclass(frozen=True)
class _Slot:
    """A Param's place among a compiled statement's parameters."""

    name: str
    field: object
    for_save: bool
    fixed: object = None  # Param.hidden's value

    def value(self, values: dict, connection):
        if self.fixed is not None:
            return self.fixed
        try:
            value = values[self.name]
        except KeyError:
            raise TypeError(f"no value for the statement's parameter {self.name!r}") from None
        if self.field is None:
            return value
        if self.for_save:
            return self.field.get_db_prep_save(value, connection)
        return self.field.get_db_prep_value(value, connection, prepared=False)


def _frozen_check(sql: str, params) -> None:
    """A value read from the clock when the statement is built would be bound to every later run
    of it (``timezone.now()`` in a builder: an expiry never passing). Refused: the builder passes
    the time as a ``Param``, or uses the database's clock (``Now()``). (SQLite's lookups turn a
    time into text before this sees it: the builders are the same, PostgreSQL's check holds.)"""
    for p in params:
        if isinstance(p, (datetime.datetime, datetime.date, datetime.timedelta)):
            raise TypeError(f"a prepared statement would keep the value {p!r} for every run; pass it as a Param: {sql}")


_PLACEHOLDER = re.compile(r"%%|%s")


def _inline_constants(sql: str, params, connection) -> tuple[str, list]:
    """PostgreSQL: the statement's constants (every parameter but a ``Param``'s: a status, a
    flag, the 1 of ``version + 1``, which the builder put there and which never change) written
    into its SQL as literals (quoted by psycopg), only the ``Param`` placeholders left.

    Why: PostgreSQL plans a prepared statement once for all values (a generic plan), and a
    condition on a parameter proves nothing about a partial index's predicate or a status's
    frequency. Planned while a fresh database's tables were nearly empty, the claim counted a
    project's running jobs by reading all of the project's jobs, and the admission looked for a
    branch's open job among all of its jobs — plans kept until the tables were analyzed, reading
    more rows at every turn as the tables grew (``pg_stat_user_indexes`` in a 1,500-turn
    ``bench/turns.py`` run: ~2,000 index entries read per claim). With the constants in the SQL,
    ``status IN ('running', 'stopping')`` is what the partial indexes are built for."""
    if connection.vendor != "postgresql":
        return sql, list(params)
    raw, values, kept = connection.connection, iter(params), []

    def one(match):
        if match.group() == "%%":
            return "%%"
        value = next(values)
        if type(value) is _Slot:
            kept.append(value)
            return "%s"
        return psycopg_sql.Literal(value).as_string(raw).replace("%", "%%")

    inlined = _PLACEHOLDER.sub(one, sql)
    if next(values, _END) is not _END:
        raise ValueError(f"more parameters than placeholders: {sql}")
    return inlined, kept


_END = object()


def _converted(rows, converters: dict, connection) -> list:
    """``SQLCompiler.apply_converters`` with the connection that ran the statement."""
    converters = list(converters.items())
    out = []
    for row in map(list, rows):
        for pos, (convs, expression) in converters:
            value = row[pos]
            for converter in convs:
                value = converter(value, expression, connection)
            row[pos] = value
        out.append(row)
    return out


def _bind(params, values: dict, connection) -> list:
    return [p.value(values, connection) if type(p) is _Slot else p for p in params]


# (alias, vendor, name, *shape) -> the compiled statement, for the whole process: its SQL depends
# on the database's vendor and the shape alone, never on one connection (under ASGI a request may
# have a connection object of its own, and a pool hands out another raw connection each time).
# Entries are added, never changed; two threads compiling one key at once both get a valid one
_STATEMENTS: dict[tuple, object] = {}


def _cached(key: tuple, compile_):
    """This thread's connection and the statement compiled for ``key`` (``compile_(connection)``
    the first time in this process). The connection is opened first (the compiler may ask the
    server's version)."""
    connection = connections[DEFAULT_DB_ALIAS]
    connection.ensure_connection()
    full_key = (connection.alias, connection.vendor, *key)
    compiled = _STATEMENTS.get(full_key)
    if compiled is None:
        token = _bound.set(None)  # compiled with placeholders, even inside an ORM-run statement
        try:
            compiled = _STATEMENTS[full_key] = compile_(connection)
        finally:
            _bound.reset(token)
    return connection, compiled


def stock() -> bool:
    """``TRELLIS_STOCK=prepared``: every statement is built and run by the ORM at each call, as
    Django does (docs/infrastructure.md)."""
    return "prepared" in settings.TRELLIS_STOCK


# --- SELECT ---------------------------------------------------------------------------------------


class Select:
    """A SELECT compiled once per process and shape: ``build(*shape)`` returns its queryset
    (of model instances, ``select_related`` followed, or ``values_list``, flat or not)."""

    def __init__(self, name: str, build):
        self.name, self.build = name, build

    def rows(self, *shape, **values) -> list:
        if stock():  # the queryset, built and compiled by the ORM at each call
            with _binding(values):
                return list(self.build(*shape))
        connection, compiled = _cached((self.name, *shape), lambda conn: _CompiledSelect(self.build(*shape), conn))
        return compiled.run(connection, values)

    def first(self, *shape, **values):
        """The first row, or None (the builder orders and limits the queryset as it needs)."""
        rows = self.rows(*shape, **values)
        return rows[0] if rows else None

    def get(self, *shape, **values):
        """The one row, or the model's ``DoesNotExist`` (builders filter on a unique key)."""
        rows = self.rows(*shape, **values)
        if not rows:
            raise self._model(shape).DoesNotExist(f"{self.name}: no row matches {values}")
        return rows[0]

    def _model(self, shape):
        return self.build(*shape).model


class _CompiledSelect:
    """What ``ModelIterable`` / ``ValuesListIterable`` do with a compiler, decided once."""

    def __init__(self, queryset, connection):
        if queryset._prefetch_related_lookups or queryset._known_related_objects:
            raise TypeError("a prepared SELECT neither prefetches nor knows related objects")
        iterable = queryset._iterable_class
        if iterable not in (ModelIterable, ValuesListIterable, FlatValuesListIterable):
            raise TypeError(f"a prepared SELECT reads model instances or value tuples, not {iterable.__name__}")
        compiler = queryset.query.get_compiler(connection=connection)
        self.sql, self.params = compiler.as_sql()
        _frozen_check(self.sql, self.params)
        self.sql, self.params = _inline_constants(self.sql, self.params, connection)
        features = connection.features  # as the compiler refuses it (SQLite: no row locks, no refusal)
        self.locks = bool(queryset.query.select_for_update) and features.has_select_for_update \
            and features.supports_transactions
        self.iterable, self.db = iterable, connection.alias
        self.width = compiler.col_count if compiler.has_extra_select else None
        self.converters = compiler.get_converters([s[0] for s in compiler.select[0:compiler.col_count]])
        if iterable is ModelIterable:
            klass_info, select = compiler.klass_info, compiler.select
            self.model = klass_info["model"]
            first, last = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
            self.span = slice(first, last)
            self.names = [f[0].target.attname for f in select[first:last]]
            self.populators = get_related_populators(klass_info, select, self.db)
            self.annotations = list(compiler.annotation_col_map.items())

    def run(self, connection, values: dict) -> list:
        if self.locks and connection.get_autocommit():  # as the compiler says it, at every call
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        with connection.cursor() as cursor:
            cursor.execute(self.sql, _bind(self.params, values, connection))
            rows = cursor.fetchall()
        if self.width is not None:
            rows = [row[:self.width] for row in rows]
        if self.converters:
            rows = _converted(rows, self.converters, connection)
        if self.iterable is FlatValuesListIterable:
            return [row[0] for row in rows]
        if self.iterable is ValuesListIterable:
            return [tuple(row) for row in rows]
        instances = []
        for row in rows:
            instance = self.model.from_db(self.db, self.names, row[self.span])
            for populator in self.populators:
                populator.populate(row, instance)
            for name, position in self.annotations:
                setattr(instance, name, row[position])
            instances.append(instance)
        return instances


# --- UPDATE … RETURNING ---------------------------------------------------------------------------


class Update:
    """A conditional ``UPDATE … RETURNING`` compiled once per process and shape:
    ``build(*shape)`` returns (queryset, {field: value}, {name: expression}) — the rows to change,
    what to set, and what else to read from each changed row — as ``update_returning`` takes them.
    ``run`` returns the changed rows as instances, as that function does."""

    def __init__(self, name: str, build):
        self.name, self.build = name, build

    def run(self, *shape, **values) -> list:
        connection = connections[DEFAULT_DB_ALIAS]
        if stock() or not connection.features.can_return_columns_from_insert:
            with _binding(values):  # through the ORM, each time (see update_returning)
                queryset, sets, returning = self.build(*shape)
                return update_returning(queryset, sets, returning)
        connection, compiled = _cached((self.name, *shape), lambda conn: _checked(compile_update_returning(
            *self._typed(*self.build(*shape)), connection=conn), conn))
        if compiled is None:
            return []
        return compiled.run(connection, values)

    @staticmethod
    def _typed(queryset, sets: dict, returning: dict):
        """A Param set as a column's value is prepared as that column's field prepares it."""
        meta = queryset.model._meta
        sets = {name: Param(value.name, meta.get_field(name)) if isinstance(value, Param)
                and value._output_field_or_none is None else value for name, value in sets.items()}
        return queryset, sets, returning


def _checked(compiled, connection):
    if compiled is not None:
        _frozen_check(compiled.sql, compiled.params)
        compiled.sql, compiled.params = _inline_constants(compiled.sql, compiled.params, connection)
    return compiled


class _binding:
    def __init__(self, values):
        self.values = values

    def __enter__(self):
        self.token = _bound.set(self.values)

    def __exit__(self, *exc):
        _bound.reset(self.token)


class _CompiledUpdate:
    def __init__(self, sql, params, model, db, converters, extra):
        self.sql, self.params, self.model, self.db = sql, params, model, db
        self.converters, self.extra = converters, extra
        self.names = [f.attname for f in model._meta.concrete_fields]

    def run(self, connection, values: dict) -> list:
        with transaction.mark_for_rollback_on_error(using=self.db), connection.cursor() as cursor:
            cursor.execute(self.sql, _bind(self.params, values, connection))
            rows = cursor.fetchall()
        if self.converters:
            rows = _converted(rows, self.converters, connection)
        width, instances = len(self.names), []
        for row in rows:
            row = tuple(row)
            instance = self.model.from_db(self.db, self.names, row[:width])
            for name, value in zip(self.extra, row[width:]):
                setattr(instance, name, value)
            instances.append(instance)
        return instances


def compile_update_returning(queryset, values: dict, returning: dict, *, connection) -> _CompiledUpdate | None:
    """``queryset.update(**values)`` + ``RETURNING`` every column and ``returning``'s expressions,
    compiled; None when the UPDATE would change nothing whatever the values (no SET)."""
    model, db = queryset.model, connection.alias
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.annotations = {}
    compiler = query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()  # as_sql sets the query up itself
    if not sql:
        return None
    fields = model._meta.concrete_fields
    columns = [connection.ops.quote_name(f.column) for f in fields]
    params = list(params)
    for expression in returning.values():
        extra_sql, extra_params = compiler.compile(expression.resolve_expression(query, allow_joins=False))
        columns.append(extra_sql)
        params.extend(extra_params)
    sql += " RETURNING " + ", ".join(columns)
    # the columns are converted as a SELECT of the model would convert them
    select = model._base_manager.using(db).all().query.get_compiler(connection=connection)
    select.setup_query()
    converters = select.get_converters([col for col, _sql, _alias in select.select])
    return _CompiledUpdate(sql, params, model, db, converters, list(returning))


def update_returning(queryset, values: dict, returning: dict) -> list:
    """Run ``queryset.update(**values)`` and return the rows it changed, as they are after it, with
    ``returning``'s expressions set on them (``collab.services.locking.update_returning``)."""
    db = queryset.db
    connection = connections[db]
    if stock() or not connection.features.can_return_columns_from_insert:  # (SQLite before 3.35)
        return _update_returning_by_orm(queryset, values, returning)
    compiled = compile_update_returning(queryset, values, returning, connection=connection)
    if compiled is None:
        return []
    return compiled.run(connection, {})


def _update_returning_by_orm(queryset, values: dict, returning: dict) -> list:
    """``update_returning`` through the ORM's public API (the stock path, and a database without
    ``RETURNING``): in one transaction, lock the rows that match (PostgreSQL re-checks the
    condition on a row another transaction changed meanwhile; SQLite's write transaction holds the
    whole database), update those, read them back with ``returning``'s expressions."""
    db = queryset.db
    features = connections[db].features
    with transaction.atomic(using=db):
        locking = queryset.select_for_update(of=("self",)) if features.has_select_for_update_of \
            else queryset.select_for_update()
        pks = list(locking.values_list("pk", flat=True))
        rows = queryset.model._base_manager.using(db).filter(pk__in=pks)
        if pks:
            rows.update(**values)
        return list(rows.annotate(**returning)) if pks else []


# --- INSERT (one row) ----------------------------------------------------------------------------


class Insert:
    """A one-row INSERT of ``model`` compiled once per process: ``create(**fields)`` does what
    ``model.objects.create(**fields)`` does for a model with no ``save()`` of its own and no signal
    receivers (Trellis has neither): the instance is made by its constructor (defaults included),
    each column's value is taken as ``save`` takes it (``pre_save``), and the columns the database
    fills (``db_default``) are read back by the same statement. A ``db_default`` column given a
    value, or a database without ``INSERT … RETURNING``, goes through ``QuerySet.create``."""

    def __init__(self, name: str, model):
        self.name, self.model = name, model

    def create(self, **fields):
        connection = connections[DEFAULT_DB_ALIAS]
        meta = self.model._meta
        if stock() or not connection.features.can_return_columns_from_insert or any(
                f.attname in fields for f in meta.local_concrete_fields if f.has_db_default()):
            return self.model._base_manager.create(**fields)
        instance = self.model(**fields)
        connection, compiled = _cached((self.name,), lambda conn: _CompiledInsert(self.model, conn))
        compiled.run(connection, instance)
        return instance


class _CompiledInsert:
    def __init__(self, model, connection):
        meta = model._meta
        self.db = connection.alias
        self.fields = [f for f in meta.local_concrete_fields if not f.generated]
        self.returning = [f for f in self.fields if f.has_db_default()]
        self.bound = [f for f in self.fields if not f.has_db_default()]
        placeholder = model(**{f.attname: Param(f.attname, f) for f in self.bound})
        query = InsertQuery(model)
        query.insert_values(self.fields, [placeholder])
        compiler = query.get_compiler(connection=connection)
        compiler.returning_fields = self.returning
        [(self.sql, self.params)] = compiler.as_sql()
        self.params = list(self.params)
        _frozen_check(self.sql, self.params)
        self.converters = compiler.get_converters([f.get_col(meta.db_table) for f in self.returning])

    def run(self, connection, instance) -> None:
        values = {f.attname: f.pre_save(instance, add=True) for f in self.bound}
        with transaction.mark_for_rollback_on_error(using=self.db), connection.cursor() as cursor:
            cursor.execute(self.sql, _bind(self.params, values, connection))
            row = cursor.fetchone() if self.returning else None
        if row is not None:
            [row] = _converted([row], self.converters, connection)
            for field, value in zip(self.returning, row):
                setattr(instance, field.attname, value)
        mark_saved(instance, self.db)


def mark_saved(instance, alias: str) -> None:
    """``instance``, whose row a statement of Trellis's own wrote (not ``Model.save``), as
    ``save`` leaves one: no longer being added, bound to the database ``alias`` that holds it.
    The one place such rows' ``_state`` is set (``Insert`` here, the event log's and a node's
    statements)."""
    instance._state.adding, instance._state.db = False, alias
