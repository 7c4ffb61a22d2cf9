"""The sha256 that saved drafts and stored data record of the model they were made for."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence


def sha256_files(paths: Sequence[str]) -> str:
  """One hex digest over `paths` in order: each file's base name, then its bytes.

  Raises:
    FileNotFoundError: a path names no file.
  """
  digest = hashlib.sha256()
  for path in paths:
    digest.update(os.path.basename(path).encode())
    with open(path, "rb") as f:
      for block in iter(lambda f=f: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()
