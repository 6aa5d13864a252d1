"""Queries written as peewee expressions, turned into SQL text once per database kind.

Building a peewee query object and its SQL costs far more than running it on the host's
hot paths (a claim check, a run's revision, a worker row). A `PreparedQuery` builds its
query once for each kind of database (SQLite, PostgreSQL, a plugin's), with named
parameters in place of the values, and afterwards only runs the cached text::

    LIVE_CLAIM = PreparedQuery(
        lambda p: Lease.select(Lease.generation).where(
            (Lease.run == p.run_id) & (Lease.expires_at > p.now)
        )
    )
    LIVE_CLAIM.scalar(run_id=run_id, now=now_ms())

Parameters are passed as the database stores them: no field conversion is applied to
them (plain strings, numbers, booleans and None need none). A parameter stands for one
value, so ``.in_()`` takes a fixed tuple of constants, never a parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import peewee

from . import server_plans
from .driver import run_sql
from .models import database_proxy
from .statements import run_later

ModelT = TypeVar("ModelT", bound=peewee.Model)


class _Parameter:
    """Stands in a compiled query's values for the argument of that name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Parameters:
    """``p.name`` is a placeholder for the keyword argument `name` of each run."""

    def __getattr__(self, name: str) -> peewee.Value:
        return peewee.Value(_Parameter(name), converter=False, unpack=False)


_PARAMETERS = Parameters()


class PreparedQuery:
    """One query: built by `build` on first use per database kind, then run from its text.

    A `planned` query (one that looks rows up, or writes them, by key) may be planned by
    the server once per connection (`server_plans`).
    """

    __slots__ = ("_build", "_compiled", "_planned")

    def __init__(
        self, build: Callable[[Parameters], peewee.BaseQuery], *, planned: bool = False
    ) -> None:
        self._build = build
        self._compiled: dict[type, tuple[str, tuple[Any, ...], bool]] = {}
        self._planned = planned

    def _compile(self, db: peewee.Database) -> tuple[str, tuple[Any, ...], bool]:
        sql, values = db.get_sql_context().sql(self._build(_PARAMETERS)).query()
        template = tuple(values)
        has_constants = any(type(value) is not _Parameter for value in template)
        compiled = self._compiled[type(db)] = (sql, template, has_constants)
        return compiled

    def sql(self) -> str:
        """The SQL text for the open database (for tests and debugging)."""
        db = database_proxy.obj
        return (self._compiled.get(type(db)) or self._compile(db))[0]

    def execute(self, **arguments: Any) -> Any:
        """Run the query on the open state database; returns its cursor."""
        db = database_proxy.obj
        run = server_plans.run if self._planned else run_sql
        return run(db, *self._sql_and_params(db, arguments))

    def _sql_and_params(
        self, db: peewee.Database, arguments: dict[str, Any]
    ) -> tuple[str, list[Any]]:
        sql, template, has_constants = self._compiled.get(type(db)) or self._compile(db)
        if has_constants:
            params = [
                arguments[value.name] if type(value) is _Parameter else value for value in template
            ]
        else:
            params = [arguments[value.name] for value in template]
        return sql, params

    def execute_later(self, **arguments: Any) -> None:
        """Run a write whose outcome nothing reads; on PostgreSQL it may travel with the
        transaction's next statement (`statements.execute_later`)."""
        db = database_proxy.obj
        run_later(db, *self._sql_and_params(db, arguments), planned=self._planned)

    def rows(self, **arguments: Any) -> list[tuple[Any, ...]]:
        fetched: list[tuple[Any, ...]] = self.execute(**arguments).fetchall()
        return fetched

    def first(self, **arguments: Any) -> tuple[Any, ...] | None:
        """The first row, or None (the query should have its own LIMIT if it may match many)."""
        found = self.execute(**arguments).fetchall()
        return found[0] if found else None

    def scalar(self, **arguments: Any) -> Any:
        """The first column of the first row, or None."""
        row = self.first(**arguments)
        return None if row is None else row[0]

    def exists(self, **arguments: Any) -> bool:
        return self.first(**arguments) is not None

    def models(self, model: type[ModelT], **arguments: Any) -> list[ModelT]:
        """Each row as a `model` object: the query selects exactly ``model``'s fields (a
        ``model.select()`` or ``select(model)``, joins allowed)."""
        return [model_instance(model, row) for row in self.rows(**arguments)]

    def changed(self, **arguments: Any) -> int:
        """Rows changed by an UPDATE or DELETE."""
        changed: int = self.execute(**arguments).rowcount
        return changed


def tuple_rows(query: peewee.SelectBase) -> Iterable[tuple[Any, ...]]:
    """`query.tuples()`, typed as what it yields: peewee's stubs type it as the query."""
    return cast("Iterable[tuple[Any, ...]]", query.tuples())


def model_instance(model: type[ModelT], row: tuple[Any, ...]) -> ModelT:
    """A model object from a row of ``model.select()`` (every field, in the model's order)."""
    fields = model._meta.sorted_fields
    return model(
        **{field.name: field.python_value(value) for field, value in zip(fields, row, strict=True)}
    )
