"""The project's SentencePiece vocabulary: training it, and loading it for seqio.

T5 conventions: pad=0, eos=1, unk=2, no bos; unigram model of 8192 pieces trained on the
training splits of both corpora (both sides), so German umlauts and ß are single pieces.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable

import sentencepiece as spm
import seqio
from sentencepiece import sentencepiece_model_pb2

from specdec_jax import atomic_io
from specdec_jax.data import layout

VOCAB_SIZE = 8192
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
_MAX_LINE_CHARS = 2000  # Long man-page descriptions are cut into lines for training.


def _training_lines(texts: Iterable[str]) -> list[str]:
  lines = []
  for text in texts:
    words = text.split()
    line: list[str] = []
    size = 0
    for word in words:
      if size + len(word) > _MAX_LINE_CHARS and line:
        lines.append(" ".join(line))
        line, size = [], 0
      line.append(word)
      size += len(word) + 1
    if line:
      lines.append(" ".join(line))
  return lines


def train_vocabulary(texts: Iterable[str], out_dir: str, vocab_size: int = VOCAB_SIZE) -> str:
  """Trains the unigram SentencePiece model deterministically; returns the .model path.

  Determinism: one thread, no sampling or shuffling of the input, fixed input order (the
  caller's). Writes `<out_dir>/specdec_sp8k.{model,vocab}` atomically.
  """
  os.makedirs(out_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tmp_vocab_") as tmp:
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in _training_lines(texts))
    prefix = os.path.join(tmp, layout.VOCAB_NAME)
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="unigram", vocab_size=vocab_size,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        character_coverage=0.9999, num_threads=1, input_sentence_size=0,
        shuffle_input_sentence=False, max_sentence_length=4 * _MAX_LINE_CHARS,
        minloglevel=2)
    # The model records its trainer's temporary paths; fixed names keep it reproducible.
    proto = sentencepiece_model_pb2.ModelProto()
    with open(prefix + ".model", "rb") as f:
      proto.ParseFromString(f.read())
    proto.trainer_spec.ClearField("input")
    proto.trainer_spec.model_prefix = layout.VOCAB_NAME
    atomic_io.atomic_write_bytes(layout.vocab_file(out_dir), proto.SerializeToString())
    os.replace(prefix + ".vocab", os.path.join(out_dir, layout.VOCAB_NAME + ".vocab"))
  return layout.vocab_file(out_dir)


def export_vocabulary(src_dir: str, dest_dir: str) -> None:
  """Copies the trained .model and .vocab from `src_dir` to `dest_dir` (e.g. the assets)."""
  for ext in (".model", ".vocab"):
    with open(os.path.join(src_dir, layout.VOCAB_NAME + ext), "rb") as f:
      atomic_io.atomic_write_bytes(os.path.join(dest_dir, layout.VOCAB_NAME + ext), f.read())


def load_processor(path: str) -> spm.SentencePieceProcessor:
  """The raw SentencePiece processor of a .model file (same ids as `get_vocabulary`)."""
  return spm.SentencePieceProcessor(model_file=path)


def default_vocab_path() -> str:
  """The committed model, `<repo>/assets/vocab/specdec_sp8k.model`."""
  return layout.vocab_file(os.path.join(layout.ASSETS_DIR, "vocab"))


def get_vocabulary(path: str | None = None) -> seqio.SentencePieceVocabulary:
  """The vocabulary as seqio sees it (no extra ids).

  Args:
    path: a .model file; default: the committed one (usable without running prepare).
  """
  path = path or default_vocab_path()
  if not os.path.exists(path):
    raise FileNotFoundError(f"path={path!r} does not exist: pass a SentencePiece .model "
                            "file or run `python -m specdec_jax.data.prepare`.")
  return seqio.SentencePieceVocabulary(path, extra_ids=0)
