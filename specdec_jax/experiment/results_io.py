"""results.jsonl: one JSON object per measured point, read back as `PointRow`s, and the best
point per setting.

Rows are rewritten atomically per append; a point's key (`PointRow.key`) is what a resumed
run skips by.
"""

from __future__ import annotations

import collections
import json
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from specdec_jax import atomic_io
from specdec_jax.experiment.record import AUTO, PointRow, point_key

RESULTS_FILE = "results.jsonl"

T = TypeVar("T")


def read_rows(path: str) -> list[dict[str, Any]]:
  """All rows of a JSON-lines file, as JSON objects ([] if it does not exist)."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def read_points(path: str) -> list[PointRow]:
  """All points of a results file ([] if it does not exist).

  Raises:
    TypeError: a row is not a `PointRow` (`PointRow.from_json`).
  """
  return [PointRow.from_json(row) for row in read_rows(path)]


def is_point_row(row: Mapping[str, Any]) -> bool:
  """Whether the JSON object `row` is a point measured by `experiments.run` (what the
  tables read)."""
  return all(field in row for field in ("task", "draft", "temperature", "gamma", "batch_size",
                                          "speedup_measured"))


def row_key(row: Mapping[str, Any]) -> tuple:
  """The point the JSON object `row` measured (`PointRow.key`, without reading the rest)."""
  return point_key(row["task"], row["draft"], row["temperature"],
                   AUTO if row.get("gamma_auto") else row["gamma"], row["batch_size"])


def append_row(path: str, row: Mapping[str, Any]) -> None:
  """Appends `row`: the whole file is rewritten to a temporary file, then os.replace'd.

  A crash leaves either the old or the new file, never a torn line.
  """
  rows = read_rows(path) + [row]
  text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
  atomic_io.atomic_write_bytes(path, text.encode("utf-8"))


def group(records: Iterable[T], *fields: str) -> dict[tuple, list[T]]:
  """Records (`PointRow`s, or any records with these attributes) by the values of `fields`,
  groups sorted by key, records in their order."""
  key = operator.attrgetter(*fields)
  groups: dict[tuple, list[T]] = collections.defaultdict(list)
  for record in records:
    value = key(record)
    groups[value if len(fields) > 1 else (value,)].append(record)
  return dict(sorted(groups.items()))


def fixed_gamma_rows(rows: Sequence[PointRow]) -> list[PointRow]:
  """The points measured at a gamma given in the config (not chosen by gamma = 'auto')."""
  return [r for r in rows if not r.gamma_auto]


def best_rows(rows: Sequence[PointRow]) -> list[PointRow]:
  """Per (task, draft, temperature), the batch-1 fixed-gamma point of highest measured
  speedup (the first of equals): the paper's Table 2, and `Experiment.best_gamma_from`."""
  batch1 = [r for r in fixed_gamma_rows(rows) if r.batch_size == 1]
  return [max(g, key=lambda r: r.speedup_measured)
          for g in group(batch1, "task", "draft", "temperature").values()]
