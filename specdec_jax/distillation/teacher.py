"""The teacher (the target) of the distillation data: loaded, identified and checked."""

from __future__ import annotations

import fcntl
import hashlib
import os
from typing import IO

import sentencepiece as spm

from specdec_jax.checkpoints import load_hf_checkpoint
from specdec_jax.data import corpora, layout
from specdec_jax.experiment import prompts
from specdec_jax.models import T5Config

DEFAULT_TEACHER = os.path.join(layout.ASSETS_DIR, "models", "target")
DEFAULT_VOCAB = prompts.VOCAB_PATH


class DistillError(ValueError):
  """A setting or input that makes the run impossible (found before any decoding)."""


def _sha256_files(paths: list[str]) -> str:
  digest = hashlib.sha256()
  for path in paths:
    digest.update(os.path.basename(path).encode())
    with open(path, "rb") as f:
      for block in iter(lambda f=f: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()


def load_teacher(path: str) -> tuple[T5Config, dict, str]:
  """The teacher's config, params and a sha256 over its config.json and weights.

  Raises:
    DistillError: `path` is not a loadable HF T5 directory.
  """
  hint = ("pass --teacher=<a HF T5 directory with config.json and model.safetensors>, "
          f"e.g. {DEFAULT_TEACHER}.")
  if not os.path.isdir(path):
    raise DistillError(f"--teacher={path!r} is not a directory: {hint}")
  try:
    cfg, params = load_hf_checkpoint(path)
  except (OSError, ValueError) as e:
    raise DistillError(f"--teacher={path!r} cannot be loaded ({e}): {hint}") from e
  files = sorted(os.path.join(path, f) for f in os.listdir(path)
                 if f == "config.json" or f.endswith(".safetensors"))
  return cfg, params, _sha256_files(files)


def check_vocab(cfg: T5Config, vocab_path: str, teacher_path: str) -> spm.SentencePieceProcessor:
  """The SentencePiece processor, after checking that it is the teacher's vocabulary.

  Raises:
    DistillError: the file is missing or unreadable, its piece count is not the
      teacher's `vocab_size`, or the teacher ships another `spiece.model`.
  """
  if not os.path.isfile(vocab_path):
    raise DistillError(f"--vocab={vocab_path!r} does not exist: pass the SentencePiece .model "
                       f"the teacher was trained with (e.g. {DEFAULT_VOCAB}).")
  try:
    processor = spm.SentencePieceProcessor(model_file=vocab_path)
  except (OSError, RuntimeError) as e:
    raise DistillError(f"--vocab={vocab_path!r} is not a SentencePiece model ({e}).") from e
  pieces = processor.get_piece_size()
  if pieces != cfg.vocab_size:
    raise DistillError(
        f"vocabulary mismatch: the teacher {teacher_path} has vocab_size={cfg.vocab_size} "
        f"in its config.json, but --vocab={vocab_path} has {pieces} pieces; pass the "
        "teacher's own vocabulary (its spiece.model) or a teacher trained on this one.")
  shipped = os.path.join(teacher_path, "spiece.model")
  if os.path.isfile(shipped) and corpora.sha256_file(shipped) != corpora.sha256_file(vocab_path):
    raise DistillError(
        f"vocabulary mismatch: the teacher ships {shipped}, which differs from "
        f"--vocab={vocab_path}; pass --vocab={shipped}.")
  return processor


def lock_directory(root: str, lock_name: str, command: str) -> IO[str]:
  """Holds an exclusive lock on `root` for the run (a second run there is refused).

  Args:
    root: the directory the run writes to (created if missing).
    lock_name: the lock file's name in it.
    command: the run's command, named in the error.

  Returns:
    The open lock file; closing it releases the lock.

  Raises:
    DistillError: another process holds the lock.
  """
  os.makedirs(root, exist_ok=True)
  handle = open(os.path.join(root, lock_name), "a+")  # noqa: SIM115 (held until closed)
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError as e:
    handle.close()
    raise DistillError(f"another {command} run is writing to {root}; wait for it or "
                       "stop it (its pid is in that run's PID file, if started so).") from e
  return handle
