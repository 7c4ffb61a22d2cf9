"""Distillation data made by the target: the on-disk format, and a reader (numpy only).

`python -m experiments.distill_data` decodes every training input of a corpus with the
target (one greedy output and some samples) and writes, per corpus:

<data_dir>/distill/<corpus>/
  shard-00000.npz ...   one per `shard_size` examples of the length-sorted order
  manifest.json         settings, and per finished shard its example range, row count,
                        sha256 and truncation counts (rewritten atomically after each shard)

A shard holds, for its `n` examples and `D` decodings (decoding 0 is greedy, the others
samples; their temperatures are in the manifest):
  ids             str   [n]           the corpus row's id
  index           int64 [n]           the row's position in <split>.jsonl
  inputs          int32 [n, L_in]     the encoder tokens the target saw (EOS-terminated,
                                      0-padded; exactly the training pipeline's inputs)
  input_lengths   int32 [n]           tokens in `inputs`, EOS included
  outputs         int32 [n, D, L_out] the target's tokens per decoding (EOS included when
                                      emitted, 0 after it)
  output_lengths  int32 [n, D]        tokens in `outputs`, EOS included
  truncated       bool  [n, D]        the decoding hit L_out without emitting EOS

The target's signals along `outputs` (its encoder outputs and top-k log-probabilities) are
stored apart, beside the shards (`teacher_signals`, `python -m experiments.teacher_signals`).
A shard file is listed in the manifest only after it has been written whole, so a file
that the manifest does not list is never read. A rerun with more samples rewrites each
shard with the new decodings appended (entry "decodings" counts them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import zipfile

import numpy as np

from specdec_jax import atomic_io
from specdec_jax.data import chat_prompts, layout, npz_io

FORMAT = "specdec_distill/1"
MANIFEST = "manifest.json"
SHARD_FIELDS = ("ids", "index", "inputs", "input_lengths", "outputs", "output_lengths",
                "truncated")
RUN_COMMAND = "python -m experiments.distill_data"


class ShardError(ValueError):
  """A shard listed in a manifest is missing, empty, corrupt or inconsistent."""


def distill_root(data_dir: str | None = None) -> str:
  """`<data_dir>/distill` (default data_dir: `layout.default_data_dir()`)."""
  return os.path.join(data_dir or layout.default_data_dir(), "distill")


def task_dir(root: str, task: str) -> str:
  """Directory of one task's shards and manifest under a distill root (a corpus for a
  T5 teacher, a `chat_prompts` task or the text corpus for a chat model)."""
  known = set(layout.CORPORA) | set(chat_prompts.TASKS) | {layout.TEXT_CORPUS}
  if task not in known:
    raise ValueError(f"task={task!r} is unknown: use one of {sorted(known)}.")
  return os.path.join(root, task)


def shard_name(shard: int) -> str:
  return f"shard-{shard:05d}.npz"


def sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def shard_bytes(arrays: dict[str, np.ndarray]) -> bytes:
  """A shard as .npz bytes that depend on the arrays only (`npz_io.npz_bytes`)."""
  return npz_io.npz_bytes(arrays, SHARD_FIELDS)


def read_manifest(directory: str) -> dict:
  """The manifest of one corpus's directory.

  Raises:
    FileNotFoundError: there is none (the message says how to make it).
    ShardError: it is not valid JSON of this format.
  """
  path = os.path.join(directory, MANIFEST)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: run `{RUN_COMMAND}` to make the "
                            "distillation data.")
  try:
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise ShardError(f"{path} is not readable JSON ({e}): delete the directory {directory} "
                     f"and rerun `{RUN_COMMAND}`.") from e
  if manifest.get("format") != FORMAT:
    raise ShardError(f"{path} has format {manifest.get('format')!r}, not {FORMAT!r}: delete "
                     f"the directory {directory} and rerun `{RUN_COMMAND}`.")
  return manifest


def write_manifest(directory: str, manifest: dict) -> None:
  atomic_io.write_json(os.path.join(directory, MANIFEST), manifest)


def load_shard(directory: str, entry: dict, *, check_sha: bool = True) -> dict[str, np.ndarray]:
  """Reads and checks one shard listed in a manifest.

  Args:
    directory: the corpus's distill directory.
    entry: the shard's manifest entry ({"shard", "file", "start", "stop", "sha256", ...}).
    check_sha: compare the file's sha256 with the manifest's.

  Returns:
    {field: array} for every field in `SHARD_FIELDS` (shapes in the module docstring).

  Raises:
    ShardError: the file is missing, empty, fails its checksum, is unreadable or holds
      another number of rows than its range; the message names the file and the fix.
  """
  path = os.path.join(directory, entry["file"])
  fix = (f"delete {path} and rerun `{RUN_COMMAND}`: it decodes shard {entry['shard']} "
         f"(examples {entry['start']}..{entry['stop'] - 1} of the length-sorted order) again.")
  if not os.path.exists(path):
    raise ShardError(f"{path} is listed in the manifest but missing: rerun `{RUN_COMMAND}`, "
                     "which decodes it again.")
  with open(path, "rb") as f:
    data = f.read()
  if not data:
    raise ShardError(f"{path} is empty (0 bytes): {fix}")
  if check_sha and sha256_bytes(data) != entry["sha256"]:
    raise ShardError(f"{path} does not match the sha256 in its manifest (corrupt or "
                     f"overwritten): {fix}")
  try:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
      arrays = {name: npz[name] for name in SHARD_FIELDS}
  except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
    raise ShardError(f"{path} is not a readable shard ({e}): {fix}") from e
  count = entry["stop"] - entry["start"]
  if any(len(a) != count for a in arrays.values()):
    raise ShardError(f"{path} holds {len(arrays['ids'])} rows, its range {count}: {fix}")
  decodings = arrays["outputs"].shape[1]
  if entry.get("decodings", decodings) != decodings:
    raise ShardError(f"{path} holds {decodings} decodings, its manifest entry "
                     f"{entry['decodings']}: {fix}")
  return arrays


@dataclasses.dataclass(frozen=True)
class DistilledData:
  """One corpus's distillation data, in corpus file order.

  Attributes:
    ids: str `[n]`.
    index: int64 `[n]`, position in `<split>.jsonl`.
    inputs: int32 `[n, L_in]` encoder tokens, EOS-terminated, 0-padded.
    input_lengths: int32 `[n]`.
    outputs: int32 `[n, D, L_out]` the target's tokens, decoding 0 greedy.
    output_lengths: int32 `[n, D]`.
    truncated: bool `[n, D]`.
    temperatures: float `[D]`, the temperature of each decoding.
    settings: the manifest's settings (teacher and vocabulary hashes, lengths, seed...).
  """
  ids: np.ndarray
  index: np.ndarray
  inputs: np.ndarray
  input_lengths: np.ndarray
  outputs: np.ndarray
  output_lengths: np.ndarray
  truncated: np.ndarray
  temperatures: np.ndarray
  settings: dict

  def __len__(self) -> int:
    return len(self.ids)

  def pairs(self, decodings: tuple[int, ...] | None = None,
            include_truncated: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flattens (example, decoding) into training pairs.

    Args:
      decodings: which decodings to use (0 greedy, 1.. samples); None: all.
      include_truncated: keep decodings that hit the length cap without EOS.

    Returns:
      inputs int32 `[m, L_in]`, targets int32 `[m, L_out]` (the target's outputs) and
      which int32 `[m, 2]` (example row, decoding) of each pair; example-major order.
    """
    decodings = tuple(range(self.outputs.shape[1])) if decodings is None else decodings
    rows, cols = np.meshgrid(np.arange(len(self)), np.asarray(decodings, np.int64),
                             indexing="ij")
    rows, cols = rows.ravel(), cols.ravel()
    if not include_truncated:
      keep = ~self.truncated[rows, cols]
      rows, cols = rows[keep], cols[keep]
    return (self.inputs[rows], self.outputs[rows, cols],
            np.stack([rows, cols], axis=1).astype(np.int32))


def read_distilled(corpus: str, *, data_dir: str | None = None, root: str | None = None,
                   require_complete: bool = True) -> DistilledData:
  """Reads one corpus's distillation data (no TensorFlow), checking every shard.

  Args:
    corpus: "ende" or "mansum".
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    root: the distill root; default `<data_dir>/distill`.
    require_complete: refuse a run that has not decoded every example yet.

  Returns:
    The data in corpus file order.

  Raises:
    FileNotFoundError: no manifest.
    ShardError: an incomplete run (with `require_complete`) or a bad shard.
  """
  directory = task_dir(root or distill_root(data_dir), corpus)
  manifest = read_manifest(directory)
  shards = sorted(manifest["shards"], key=lambda e: e["shard"])
  if require_complete and not manifest["complete"]:
    raise ShardError(f"{directory}: {len(shards)} of {manifest['num_shards']} shards are "
                     f"written; rerun `{RUN_COMMAND}` to finish (it resumes), or pass "
                     "require_complete=False to read what is there.")
  settings = manifest["settings"]
  if not shards:
    raise ShardError(f"{directory}: the manifest lists no shards yet; rerun `{RUN_COMMAND}`.")
  parts = [load_shard(directory, entry) for entry in shards]
  # Shards of a run that is adding samples to an earlier one differ: keep the common ones.
  decodings = min(p["outputs"].shape[1] for p in parts)
  for p in parts:
    for name in ("outputs", "output_lengths", "truncated"):
      p[name] = p[name][:, :decodings]
  merged = {name: np.concatenate([p[name] for p in parts]) for name in SHARD_FIELDS}
  order = np.argsort(merged["index"], kind="stable")
  return DistilledData(**{name: merged[name][order] for name in SHARD_FIELDS},
                       temperatures=np.asarray(settings["temperatures"][:decodings], np.float32),
                       settings=settings)


def num_rows(corpus: str, *, data_dir: str | None = None, root: str | None = None) -> int:
  """Examples x decodings of a complete run, from its manifest alone (for mixing rates)."""
  directory = task_dir(root or distill_root(data_dir), corpus)
  manifest = read_manifest(directory)
  return sum(e["count"] for e in manifest["shards"]) * len(manifest["settings"]["temperatures"])
