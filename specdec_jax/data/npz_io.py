"""Compressed .npz bytes that depend on the arrays only, and their reading back (numpy only).

`np.savez_compressed` stamps each member with the time it was written, so the same arrays
give other bytes on every run; these fix the stamp, so a file's sha256 identifies its
arrays and a rerun that computes the same arrays writes the same file.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence

import numpy as np


def npz_bytes(arrays: dict[str, np.ndarray], names: Sequence[str]) -> bytes:
  """The arrays `names` of `arrays` (in that order) as deflated .npz bytes.

  Raises:
    ValueError: a name in `names` is not in `arrays`.
  """
  missing = [name for name in names if name not in arrays]
  if missing:
    raise ValueError(f"arrays lack {missing}.")
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
    for name in names:
      info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      array = io.BytesIO()
      np.lib.format.write_array(array, np.asarray(arrays[name]), allow_pickle=False)
      zf.writestr(info, array.getvalue())
  return buffer.getvalue()


def load_npz(data: bytes, names: Sequence[str]) -> dict[str, np.ndarray]:
  """The arrays `names` of .npz bytes.

  Raises:
    ValueError: the bytes are not an .npz file holding every name (the message says why).
  """
  try:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
      return {name: npz[name] for name in names}
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    raise ValueError(f"not an .npz file with {list(names)} ({type(e).__name__}: {e})") from e
