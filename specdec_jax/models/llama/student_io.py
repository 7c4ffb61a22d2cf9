"""A trained `Student` draft on disk, tied to the target whose embedding it reads.

<directory>/
  config.json         {"format", "student": StudentConfig.to_dict(), "target": {"sha256",
                      "vocab_size", "embed_dim", "file"}}
  model.safetensors   every parameter as float16 under its "/"-joined path, and
                      "head_tokens" (int32 `[head]`, the shortlist)
  README.md           the card (written by the exporter)

The draft owns no embedding: it reads its target's, so it is refused before any
work for a target whose file differs (`check_target`): another vocabulary or
tokenizer would give its ids other meanings. `load_draft` reads, checks and builds
one for generation beside its target's scorer.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import safetensors.numpy

from specdec_jax import atomic_io, checksums
from specdec_jax.models.llama.feature_draft import FeatureDraft
from specdec_jax.models.llama.model import LlamaWeights
from specdec_jax.models.llama.scorer import LlamaScorer
from specdec_jax.models.llama.student import Student, StudentConfig, StudentDraft

FORMAT = "specdec_student/1"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
HEAD = "head_tokens"


@dataclasses.dataclass(frozen=True)
class TargetId:
  """The target a draft was trained for.

  Attributes:
    sha256: of its GGUF file (`checksums.sha256_files([file])`).
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


def build_draft(saved: SavedStudent, target: LlamaScorer) -> StudentDraft | FeatureDraft:
  """A saved draft for generation beside `target`: in the target's compute and parameter
  dtypes and decode options, reading its prepared embedding. The caller has checked
  that `target` is the one it was trained for (`check_target`).

  Raises:
    ValueError: `target` holds raw parameters, not prepared weights.
  """
  if not isinstance(target.weights, LlamaWeights):
    raise ValueError("the target scorer's weights must be prepared, as the draft reads its "
                     "prepared embedding: LlamaScorer(model, model.prepare(params)).")
  config = target.model.config
  blocks = saved.config.blocks.replace(dtype=config.dtype, param_dtype=config.param_dtype)
  student = Student(dataclasses.replace(saved.config, blocks=blocks),
                    options=target.model.options)
  return student.draft(saved.params, target.weights.embedding, saved.head_tokens)


def load_draft(directory: str, target: LlamaScorer, target_file: str
               ) -> StudentDraft | FeatureDraft:
  """The draft saved in `directory`, checked against its target, ready to decode.

  Args:
    directory: a saved draft (`save_student`; e.g. assets/models/draft_smollm2_eagle).
    target: the target's scorer (its weights prepared from `target_file`).
    target_file: the GGUF file the target was read from (`GGUFCheckpoint.path`).

  Returns:
    A `FeatureDraft` if the draft reads the target's features, else a `StudentDraft`.

  Raises:
    FileNotFoundError: `directory` holds no saved draft.
    ValueError: it was trained for another file, vocabulary or embedding width
      (`check_target`), is not a saved draft of this format, or `target`'s weights are
      not prepared (`build_draft`).
  """
  saved = load_student(directory)
  config = target.model.config
  check_target(saved, directory, checksums.sha256_files([target_file]), config.vocab_size,
               config.d_model, os.path.basename(target_file))
  return build_draft(saved, target)
