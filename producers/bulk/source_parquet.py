"""Streaming Parquet input: one record batch at a time, starting at the right row group.

Two layouts are read. A *tensor column* (``--input-column``, or a column named
``inputs``) holds one list (or fixed-size list, or list of lists) per row.
Otherwise numeric *feature columns* (``--feature-columns``, default: every
numeric column but the ID column) are stacked into one row vector per row.
A null cell makes that row invalid, never the file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

from batchfleet.producers.bulk.errors import InputFormatError
from batchfleet.producers.bulk.rows import Position, Row, coerce_tensors, invalid_row
from batchfleet.producers.bulk.spec import JobSpec
from batchfleet.schemas.errors import ValidationError

BATCH_ROWS = 4096
#: Column names that almost always hold a row's identifier, not a feature.
ID_LIKE: Final = frozenset({"id", "request_id", "custom_id", "row_id"})


def id_like_features(features: Sequence[str], id_column: str) -> tuple[str, ...]:
    """Warnings for feature columns named like IDs: stacked in, they change every row's shape.

    A file keyed by ``id`` with the default ``--id-column custom_id`` would
    otherwise score ``id`` as one more feature and fail every row on shape.
    """
    return tuple(
        f"column {name!r} looks like a row ID but is stacked into the features: pass "
        f"--id-column {name} (or list the features with --feature-columns)"
        for name in features if name.lower() in ID_LIKE and name != id_column)


def _is_list(t: Any) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_fixed_size_list(t))


def _is_numeric(t: Any) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _dense(cell: Any) -> Any:
    """pyarrow turns a list of lists into object arrays of arrays; stack them back."""
    if isinstance(cell, np.ndarray) and cell.dtype == object:
        return np.array([_dense(c) for c in cell])
    return cell


class ParquetSource:
    def __init__(self, spec: JobSpec, file: Any = None) -> None:
        """``file``: an open random-access file for a part that is not local (S3)."""
        try:
            self._file = pq.ParquetFile(spec.input if file is None else file)
        except (pa.ArrowException, OSError) as exc:
            raise InputFormatError(f"{spec.input}: not a readable Parquet file: {exc}") from exc
        schema = self._file.schema_arrow
        self.dtype = spec.dtype
        self.total: int | None = int(self._file.metadata.num_rows)
        self.id_column = spec.id_column if spec.id_column in schema.names else None
        #: The ID column's Arrow type, so the output keeps it unchanged.
        self.id_type: Any = schema.field(self.id_column).type if self.id_column else None
        self.tensor_column: str | None = None
        self.features: tuple[str, ...] = ()
        if spec.input_column or (not spec.feature_columns and "inputs" in schema.names):
            self.tensor_column = spec.input_column or "inputs"
            self._check(schema, [self.tensor_column], _is_list, "a list (tensor) column")
        else:
            self.features = spec.feature_columns or tuple(
                f.name for f in schema if f.name != self.id_column and _is_numeric(f.type))
            if not self.features:
                raise InputFormatError(f"{spec.input}: no 'inputs' list column and no numeric "
                                       "feature columns to stack")
            self._check(schema, self.features, _is_numeric, "numeric")
        #: Only for features picked by default: columns listed by hand are meant.
        self.warnings: tuple[str, ...] = () if spec.feature_columns else id_like_features(
            self.features, spec.id_column)

    def _check(self, schema: Any, names: Sequence[str], ok: Any, what: str) -> None:
        for name in names:
            if name not in schema.names:
                raise InputFormatError(f"column {name!r} is not in the file "
                                       f"(columns: {', '.join(schema.names)})")
            if not ok(schema.field(name).type):
                raise InputFormatError(f"column {name!r} is {schema.field(name).type}, "
                                       f"not {what}")

    def rows(self, start: Position, wanted: Iterator[int] | None = None) -> Iterator[Row]:
        meta = self._file.metadata
        first_group, base = 0, 0
        while (first_group < meta.num_row_groups
               and base + meta.row_group(first_group).num_rows <= start.rows):
            base += meta.row_group(first_group).num_rows
            first_group += 1
        columns = [c for c in (self.id_column, self.tensor_column, *self.features) if c]
        target = next(wanted, None) if wanted is not None else None
        batches = self._file.iter_batches(
            batch_size=BATCH_ROWS, row_groups=range(first_group, meta.num_row_groups),
            columns=columns, use_threads=False)
        for batch in batches:
            end = base + batch.num_rows
            if wanted is None:
                picks = list(range(max(0, start.rows - base), batch.num_rows))
            else:
                picks = []
                while target is not None and target < end:
                    if target >= base:
                        picks.append(target - base)
                    target = next(wanted, None)
            if picks:
                yield from self._batch_rows(batch, base, picks)
            if wanted is not None and target is None:
                return
            base = end

    def _batch_rows(self, batch: Any, base: int, picks: list[int]) -> Iterator[Row]:
        ids = batch.column(self.id_column).to_pylist() if self.id_column else None
        cells, bad = self._tensor_cells(batch) if self.tensor_column else self._features(batch)
        for k in picks:
            custom_id = ids[k] if ids is not None else None
            if bad[k]:
                yield invalid_row(base + k, f"row {base + k}: {bad[k]}", custom_id=custom_id)
                continue
            try:
                yield Row(base + k, coerce_tensors(_dense(cells[k]), self.dtype), custom_id)
            except (ValidationError, ValueError, TypeError) as exc:
                yield invalid_row(base + k, f"row {base + k}: {exc}", custom_id=custom_id)

    def _tensor_cells(self, batch: Any) -> tuple[Any, list[str]]:
        column = batch.column(self.tensor_column)
        cells = column.to_numpy(zero_copy_only=False)
        bad = ["" if c is not None else f"{self.tensor_column} is null" for c in cells]
        if pc.list_flatten(column).null_count:  # rare: find the rows with null elements
            for k in range(len(column)):
                if not bad[k] and pc.list_flatten(column.slice(k, 1)).null_count:
                    bad[k] = f"{self.tensor_column} has null elements"
        return cells, bad

    def _features(self, batch: Any) -> tuple[Any, list[str]]:
        bad = [""] * batch.num_rows
        columns = []
        for name in self.features:
            column = batch.column(name)
            if column.null_count:
                for k in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)):
                    bad[k] = bad[k] or f"feature {name!r} is null"
            columns.append(column.to_numpy(zero_copy_only=False))
        return np.stack(columns, axis=1), bad
