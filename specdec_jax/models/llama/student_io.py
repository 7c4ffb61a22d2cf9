"""A trained `Student` draft on disk, tied to the target whose embedding it reads.

<directory>/
  config.json         {"format", "student": StudentConfig.to_dict(), "target": {"sha256",
                      "vocab_size", "embed_dim", "file"}}
  model.safetensors   every parameter as float16 under its "/"-joined path, and
                      "head_tokens" (int32 `[head]`, the shortlist)
  README.md           the card (written by the exporter)

The draft owns no embedding: it reads its target's, so it is refused before any
work for a target whose file differs (`check_target`): another vocabulary or
tokenizer would give its ids other meanings.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import safetensors.numpy

from specdec_jax import atomic_io
from specdec_jax.models.llama.student import StudentConfig

FORMAT = "specdec_student/1"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
HEAD = "head_tokens"


@dataclasses.dataclass(frozen=True)
class TargetId:
  """The target a draft was trained for.

  Attributes:
    sha256: of its GGUF file (`distillation.teacher.teacher_sha256`).
    vocab_size: its vocabulary's size.
    embed_dim: its embedding's width.
    file: the file's name (for messages).
  """

  sha256: str
  vocab_size: int
  embed_dim: int
  file: str


@dataclasses.dataclass(frozen=True)
class SavedStudent:
  """A draft as loaded: config, float32 parameters, its shortlist and its target."""

  config: StudentConfig
  params: dict
  head_tokens: np.ndarray
  target: TargetId


def _flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(_flatten(value, name + "/"))
    else:
      out[name] = np.asarray(value)
  return out


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
  tree: dict = {}
  for name, value in flat.items():
    node = tree
    *parents, leaf = name.split("/")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def save_student(directory: str, config: StudentConfig, params: dict, head_tokens: np.ndarray,
                 target: TargetId) -> None:
  """Writes config.json and model.safetensors (float16), each atomically.

  Raises:
    ValueError: a parameter beyond float16's range, or a shortlist of another length
      than the config's.
  """
  head = np.asarray(head_tokens, np.int32)
  if head.shape != (config.head_size,):
    raise ValueError(f"head_tokens has shape {head.shape}, the config's head_size is "
                     f"{config.head_size}.")
  tensors = {}
  for name, value in _flatten(params).items():
    half = value.astype(np.float16)
    if not np.all(np.isfinite(half)):
      raise ValueError(f"parameter {name} holds values beyond float16's range.")
    tensors[name] = half
  tensors[HEAD] = head
  os.makedirs(directory, exist_ok=True)
  atomic_io.atomic_write_bytes(os.path.join(directory, WEIGHTS), safetensors.numpy.save(tensors))
  atomic_io.write_json(os.path.join(directory, CONFIG), {
      "format": FORMAT, "student": config.to_dict(), "target": dataclasses.asdict(target)})


def load_student(directory: str) -> SavedStudent:
  """Reads a saved draft (parameters as float32).

  Raises:
    FileNotFoundError: no config.json or model.safetensors in `directory`.
    ValueError: another format, or a shortlist that does not match the config.
  """
  config_path, weights_path = (os.path.join(directory, f) for f in (CONFIG, WEIGHTS))
  for path in (config_path, weights_path):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{path} is missing: {directory} is not a saved draft "
                              "(export one with `python -m experiments.train ...`).")
  with open(config_path, encoding="utf-8") as f:
    meta = json.load(f)
  if meta.get("format") != FORMAT:
    raise ValueError(f"{config_path} has format {meta.get('format')!r}, not {FORMAT!r}.")
  config = StudentConfig.from_dict(meta["student"])
  with open(weights_path, "rb") as f:
    flat = safetensors.numpy.load(f.read())
  head = flat.pop(HEAD).astype(np.int32)
  if head.shape != (config.head_size,):
    raise ValueError(f"{weights_path}: head_tokens has shape {head.shape}, the config's "
                     f"head_size is {config.head_size}.")
  params = _unflatten({k: v.astype(np.float32) for k, v in flat.items()})
  return SavedStudent(config, params, head, TargetId(**meta["target"]))


def check_target(saved: SavedStudent, where: str, sha256: str, vocab_size: int,
                 embed_dim: int, file: str) -> None:
  """Refuses a target other than the one the draft was trained for.

  Args:
    saved: the draft.
    where: names the draft in the message (e.g. its directory).
    sha256, vocab_size, embed_dim, file: the target's.

  Raises:
    ValueError: naming both targets.
  """
  want = saved.target
  if (want.vocab_size, want.embed_dim) != (vocab_size, embed_dim) or want.sha256 != sha256:
    raise ValueError(
        f"the draft {where} was trained for {want.file} (sha256 {want.sha256[:12]}..., "
        f"vocabulary {want.vocab_size}, embedding width {want.embed_dim}), but the target is "
        f"{file} (sha256 {sha256[:12]}..., vocabulary {vocab_size}, embedding width "
        f"{embed_dim}): its token ids and embedding would mean other things; use a draft "
        "trained for this target.")
