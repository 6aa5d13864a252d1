"""`pi-workflows state copy --to URL`: move a home's state into a new database (SPEC §14).

A team that outgrows one machine copies its SQLite state into an empty PostgreSQL
database and points every host at it. The copy is one transaction on the target: it
either holds every row of every table or nothing.
"""

from __future__ import annotations

from typing import Any

import peewee

from .. import plugins
from ..errors import DatabaseUrlError, InvalidInputError
from .database import StateStore, check_schema_meta, describe_location, masked_url
from .models import ALL_MODELS, SchemaMeta

BATCH_ROWS = 500


def copy_state(source: StateStore, target_url: str) -> dict[str, Any]:
    """Copy every table of `source` into the empty database at `target_url`.

    Refuses a target that holds any pi-workflows row (or foreign tables) before writing.
    Returns the target's location (without credentials) and the rows copied per table.
    """
    target = plugins.open_database(target_url, source.home.root)
    if target is None:
        raise DatabaseUrlError(
            f"No storage plugin can open {masked_url(target_url)!r}; check --to."
        )
    where = describe_location(target)
    if source.url == target_url or (
        isinstance(target, peewee.SqliteDatabase) and source.location == target.database
    ):
        raise InvalidInputError("The copy target is the source database; choose another --to.")
    try:
        target.connect(reuse_if_open=True)
    except peewee.OperationalError as exc:
        raise DatabaseUrlError(f"Cannot connect to {where}: {exc}".strip()) from exc
    try:
        with target.bind_ctx(ALL_MODELS):
            _refuse_non_empty(target, where)
            copied = _copy_tables(source, target)
    finally:
        target.close()
    return {"target": where, "rows": copied}


def _refuse_non_empty(target: peewee.Database, where: str) -> None:
    tables = set(target.get_tables())
    if not tables:
        return
    meta = SchemaMeta.get_or_none(SchemaMeta.id == 1) if "schema_meta" in tables else None
    check_schema_meta(
        (meta.schema_name, meta.schema_version) if meta else None,
        where,
        is_sqlite=isinstance(target, peewee.SqliteDatabase),
    )
    filled = [m._meta.table_name for m in ALL_MODELS if m is not SchemaMeta and m.select().exists()]
    if filled:
        raise InvalidInputError(
            f"{where} already holds pi-workflows state ({', '.join(filled)}); copy into a new, "
            "empty database."
        )


def _copy_tables(source: StateStore, target: peewee.Database) -> dict[str, int]:
    rows_by_source = {model: _source_rows(source, model) for model in ALL_MODELS}
    copied: dict[str, int] = {}
    with target.atomic():
        target.create_tables(ALL_MODELS)
        SchemaMeta.delete().execute()
        for model, rows in rows_by_source.items():
            fields = model._meta.sorted_fields
            count = 0
            for batch in _batches(rows):
                model.insert_many(batch, fields=fields).execute()
                count += len(batch)
            copied[model._meta.table_name] = count
        if isinstance(target, peewee.PostgresqlDatabase):
            _advance_sequences(target)
    return copied


def _source_rows(source: StateStore, model: type[peewee.Model]) -> Any:
    """The source table's rows as Python values (booleans as bools, blobs as bytes)."""
    fields = model._meta.sorted_fields
    key = model._meta.primary_key
    order = (
        [model._meta.fields[name] for name in key.field_names]
        if isinstance(key, peewee.CompositeKey)
        else [key]
    )
    with source.db.bind_ctx([model]):
        return list(model.select(*fields).order_by(*order).tuples())


def _batches(rows: list[tuple[Any, ...]]) -> Any:
    for start in range(0, len(rows), BATCH_ROWS):
        yield [
            tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
            for row in rows[start : start + BATCH_ROWS]
        ]


def _advance_sequences(target: peewee.PostgresqlDatabase) -> None:
    """Serial keys continue after the copied rows."""
    for model in ALL_MODELS:
        key = model._meta.primary_key
        if isinstance(key, peewee.AutoField):
            table = model._meta.table_name
            target.execute_sql(
                f"SELECT setval(pg_get_serial_sequence('{table}', '{key.column_name}'), "
                f"COALESCE((SELECT MAX({key.column_name}) FROM {table}), 0) + 1, false)"
            )
