"""The distillation data's token ids in one small file, and back (numpy only).

Decoding every training input with the target takes hours; its token ids take a few
MB. `export_archive` packs complete corpora of `<data_dir>/distill/` into one deflated
.npz (small enough to commit), `import_archive` writes them back as shards and manifests
that are byte for byte the originals (each shard's sha256 is checked against its
manifest), so a new machine has the data without decoding again (the target's signals
are then recomputed from it: `python -m experiments.teacher_signals`).

Archive members, per corpus `c`, rows in shard order (the manifest's):
  format                str   the archive's format
  c/manifest            uint8 [bytes]   the distillation manifest file, verbatim
  c/ids                 str   [n]
  c/index               int64 [n]
  c/input_lengths       int32 [n]
  c/input_tokens        uint16 or int32 [sum input_lengths]    each row's tokens, in turn
  c/output_lengths      int32 [n, D]
  c/output_tokens       uint16 or int32 [sum output_lengths]   each decoding's tokens, in turn
  c/truncated           bool  [n, D]
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from specdec_jax import atomic_io
from specdec_jax.data import distill, npz_io

FORMAT = "specdec_distill_tokens/1"
_FIELDS = ("manifest", "ids", "index", "input_lengths", "input_tokens", "output_lengths",
           "output_tokens", "truncated")


def _tokens(padded: np.ndarray, lengths: np.ndarray, what: str) -> np.ndarray:
  """The tokens before each row's length, row after row (the rest must be 0)."""
  mask = np.arange(padded.shape[-1]) < lengths[..., None]
  if padded[~mask].any():
    raise distill.ShardError(f"{what} holds tokens after their length: the data is not in "
                             f"{distill.FORMAT}; it cannot be packed without loss.")
  tokens = padded[mask]
  small = tokens.size == 0 or (tokens.min() >= 0 and tokens.max() <= np.iinfo(np.uint16).max)
  return tokens.astype(np.uint16 if small else np.int32)


def _padded(tokens: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
  """int32 `[*lengths.shape, width]`: `_tokens` undone."""
  out = np.zeros(lengths.shape + (width,), np.int32)
  out[np.arange(width) < lengths[..., None]] = tokens
  return out


def export_archive(path: str, corpora: tuple[str, ...], *, data_dir: str | None = None,
                   root: str | None = None) -> dict[str, int]:
  """Packs the token ids of complete corpora into one .npz at `path` (atomically).

  Args:
    path: the archive to write.
    corpora: which corpora ("ende", "mansum").
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    root: the distill root; default `<data_dir>/distill`.

  Returns:
    Examples per corpus.

  Raises:
    FileNotFoundError, distill.ShardError: a corpus without data, unfinished, or with a
      bad shard.
  """
  root = root or distill.distill_root(data_dir)
  arrays = {"format": np.array(FORMAT)}
  counts = {}
  for corpus in corpora:
    directory = distill.task_dir(root, corpus)
    manifest = distill.read_manifest(directory)
    if not manifest["complete"]:
      raise distill.ShardError(f"{directory}: {len(manifest['shards'])} of "
                               f"{manifest['num_shards']} shards are written; finish "
                               f"`{distill.RUN_COMMAND}` before exporting it.")
    parts = [distill.load_shard(directory, e)
             for e in sorted(manifest["shards"], key=lambda e: e["shard"])]
    merged = {k: np.concatenate([p[k] for p in parts]) for k in distill.SHARD_FIELDS}
    with open(os.path.join(directory, distill.MANIFEST), "rb") as f:
      arrays[f"{corpus}/manifest"] = np.frombuffer(f.read(), np.uint8)
    for name in ("ids", "index", "input_lengths", "output_lengths", "truncated"):
      arrays[f"{corpus}/{name}"] = merged[name]
    arrays[f"{corpus}/input_tokens"] = _tokens(merged["inputs"], merged["input_lengths"],
                                               f"{directory}'s inputs")
    arrays[f"{corpus}/output_tokens"] = _tokens(merged["outputs"], merged["output_lengths"],
                                                f"{directory}'s outputs")
    counts[corpus] = len(merged["ids"])
  names = ["format"] + [f"{c}/{name}" for c in corpora for name in _FIELDS]
  atomic_io.atomic_write_bytes(path, npz_io.npz_bytes(arrays, names))
  return counts


def import_archive(path: str, *, data_dir: str | None = None,
                   root: str | None = None) -> dict[str, int]:
  """Writes every corpus of an archive back as shards and a manifest.

  Args:
    path: an archive written by `export_archive`.
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    root: the distill root to write into; default `<data_dir>/distill`.

  Returns:
    Examples per corpus.

  Raises:
    ValueError: `path` is not such an archive, or a corpus's directory already has a
      manifest (the message says what to do).
    distill.ShardError: a rebuilt shard differs from its manifest's sha256.
  """
  root = root or distill.distill_root(data_dir)
  fix = "pass a file written by `python -m experiments.distill_data --archive=export`."
  try:
    with np.load(path, allow_pickle=False) as npz:
      arrays = {name: npz[name] for name in npz.files}
  except (OSError, ValueError, zipfile.BadZipFile) as e:
    raise ValueError(f"{path} is not a distillation archive ({e}): {fix}") from e
  if "format" not in arrays or str(arrays["format"]) != FORMAT:
    raise ValueError(f"{path} has format {str(arrays.get('format'))!r}, not {FORMAT!r}: {fix}")
  corpora = sorted({name.split("/")[0] for name in arrays if "/" in name})
  missing = [f"{c}/{n}" for c in corpora for n in _FIELDS if f"{c}/{n}" not in arrays]
  if missing:
    raise ValueError(f"{path} lacks {missing}: {fix}")
  counts = {}
  for corpus in corpora:
    directory = distill.task_dir(root, corpus)
    if os.path.exists(os.path.join(directory, distill.MANIFEST)):
      raise ValueError(f"{directory} already holds distillation data: delete it, or pass "
                       "another --data_dir, to import it from the archive.")
    a = {n: arrays[f"{corpus}/{n}"] for n in _FIELDS}
    manifest_bytes = a["manifest"].tobytes()
    manifest = json.loads(manifest_bytes)
    settings = manifest["settings"]
    rows = {"ids": a["ids"], "index": a["index"], "input_lengths": a["input_lengths"],
            "output_lengths": a["output_lengths"], "truncated": a["truncated"],
            "inputs": _padded(a["input_tokens"], a["input_lengths"], settings["inputs_length"]),
            "outputs": _padded(a["output_tokens"], a["output_lengths"],
                               settings["max_decode_len"])}
    start = 0
    for entry in sorted(manifest["shards"], key=lambda e: e["shard"]):
      stop = start + entry["count"]
      shard = distill.shard_bytes({k: v[start:stop] for k, v in rows.items()})
      if distill.sha256_bytes(shard) != entry["sha256"]:
        raise distill.ShardError(f"{path}: shard {entry['shard']} of {corpus} rebuilt from the "
                                 "archive differs from its manifest's sha256 (a damaged "
                                 "archive): export it again from the original data.")
      atomic_io.atomic_write_bytes(os.path.join(directory, entry["file"]), shard)
      start = stop
    atomic_io.atomic_write_bytes(os.path.join(directory, distill.MANIFEST), manifest_bytes)
    counts[corpus] = len(a["ids"])
  return counts
