"""results.jsonl: one JSON object per measured point, its key, and the best point per setting.

Also the JSON-list files of the benchmarks (`append_to_json_list`).

Rows are rewritten atomically per append; `row_key` is what a resumed run skips by.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable, Sequence

from specdec_jax import atomic_io

RESULTS_FILE = "results.jsonl"
AUTO = "auto"  # In Experiment.gammas: chosen per point by `gamma_choice` after a calibration.

Row = dict


def point_key(task: str, draft: str, temperature: float, gamma: int | str,
              batch_size: int) -> tuple:
  """The identity of a point: (task, draft name, temperature, gamma or AUTO, batch size)."""
  return (task, draft, float(temperature), gamma if gamma == AUTO else int(gamma),
          int(batch_size))


def read_rows(path: str) -> list[Row]:
  """All rows of a results file ([] if it does not exist)."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def is_point_row(row: Row) -> bool:
  """Whether `row` is a point measured by `experiments.run` (what the tables read)."""
  return all(field in row for field in ("task", "draft", "temperature", "gamma", "batch_size",
                                          "speedup_measured"))


def row_key(row: Row) -> tuple:
  """The point a row measured (see `point_key`); gamma is 'auto' for a row whose
  gamma was chosen automatically (`gamma_auto`)."""
  return point_key(row["task"], row["draft"], row["temperature"],
                   AUTO if row.get("gamma_auto") else row["gamma"], row["batch_size"])


def append_row(path: str, row: Row) -> None:
  """Appends `row`: the whole file is rewritten to a temporary file, then os.replace'd.

  A crash leaves either the old or the new file, never a torn line.
  """
  rows = read_rows(path) + [row]
  text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
  atomic_io.atomic_write_bytes(path, text.encode("utf-8"))


def append_to_json_list(path: str, row: Row) -> None:
  """Appends `row` to the JSON list at `path` (a benchmark's rows), replacing the file
  atomically."""
  rows = []
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      rows = json.load(f)
  atomic_io.write_json(path, rows + [row])


def group(rows: Iterable[Row], *fields: str) -> dict[tuple, list[Row]]:
  """Rows by the values of `fields`, groups sorted by key, rows in their order."""
  groups: dict[tuple, list[Row]] = collections.defaultdict(list)
  for row in rows:
    groups[tuple(row[f] for f in fields)].append(row)
  return dict(sorted(groups.items()))


def fixed_gamma_rows(rows: Sequence[Row]) -> list[Row]:
  """The rows measured at a gamma given in the config (not chosen by gamma = 'auto')."""
  return [r for r in rows if not r.get("gamma_auto")]


def best_rows(rows: Sequence[Row]) -> list[Row]:
  """Per (task, draft, temperature), the batch-1 fixed-gamma point of highest measured
  speedup (the first of equals): the paper's Table 2, and `Experiment.best_gamma_from`."""
  batch1 = [r for r in fixed_gamma_rows(rows) if r["batch_size"] == 1]
  return [max(g, key=lambda r: r["speedup_measured"])
          for g in group(batch1, "task", "draft", "temperature").values()]
