"""Files written atomically: readers see the old file or the whole new one, never a part."""

from __future__ import annotations

import json
import os
import tempfile


def atomic_write_bytes(path: str, data: bytes) -> None:
  """Writes `data` to `path` through a temporary file in the same directory and os.replace."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp_")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be shared.
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def atomic_write_text(path: str, text: str) -> None:
  """`atomic_write_bytes` of `text` encoded as UTF-8."""
  atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj: object) -> None:
  """Writes `obj` as indented, key-sorted JSON."""
  atomic_write_text(path, json.dumps(obj, ensure_ascii=False, sort_keys=True, indent=2) + "\n")
