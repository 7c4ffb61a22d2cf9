"""results.jsonl: one JSON object per measured point, rewritten atomically per append."""

from __future__ import annotations

import json
import os

from experiments.config import AUTO, point_key
from specdec_jax import atomic_io

RESULTS_FILE = "results.jsonl"


def read_rows(path: str) -> list[dict]:
  """All rows of a results file ([] if it does not exist)."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def row_key(row: dict) -> tuple:
  """The point a row measured (see `config.point_key`); gamma is 'auto' for a row whose
  gamma was chosen automatically (`gamma_auto`)."""
  return point_key(row["task"], row["draft"], row["temperature"],
                   AUTO if row.get("gamma_auto") else row["gamma"], row["batch_size"])


def append_row(path: str, row: dict) -> None:
  """Appends `row`: the whole file is rewritten to a temporary file, then os.replace'd.

  A crash leaves either the old or the new file, never a torn line.
  """
  rows = read_rows(path) + [row]
  text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
  atomic_io.atomic_write_bytes(path, text.encode("utf-8"))
