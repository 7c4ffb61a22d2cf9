"""Where the data layer's files live, and the corpora it builds (no TensorFlow needed).

<data_dir>/
  debs/                       the four .deb packages (apt-get download)
  unpacked/<package>/         their contents (dpkg-deb -x)
  corpora/<corpus>/<split>.jsonl   {"id", "inputs", "targets", "page"} per line
  vocab/specdec_sp8k.{model,vocab}
  stats/<corpus>_ngram.npz
  manifest.json               sha256 and row counts of all of the above (written last)
"""

from __future__ import annotations

import dataclasses
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS_DIR = os.path.join(REPO_ROOT, "assets")
DATA_DIR_ENV = "SPECDEC_DATA_DIR"
SPLITS = ("train", "validation", "test")
VOCAB_NAME = "specdec_sp8k"
MANIFEST = "manifest.json"


@dataclasses.dataclass(frozen=True)
class Corpus:
  """One corpus and the seqio Task built on it.

  Attributes:
    name: directory name under <data_dir>/corpora.
    task: seqio Task name.
    prefix: task prefix prepended to the inputs (the JSONL stores inputs without it).
  """
  name: str
  task: str
  prefix: str


CORPORA = {
    "ende": Corpus("ende", "specdec_ende", "translate English to German: "),
    "mansum": Corpus("mansum", "specdec_mansum", "summarize: "),
}
MIXTURE = "specdec_mix"
# The chat-shaped text corpus for a chat target (`text_corpus`, `experiments.text_corpus`).
TEXT_CORPUS = "docs"


def default_data_dir() -> str:
  """`$SPECDEC_DATA_DIR`, else `<repo>/data_cache`."""
  return os.environ.get(DATA_DIR_ENV) or os.path.join(REPO_ROOT, "data_cache")


def corpus_file(data_dir: str, corpus: str, split: str) -> str:
  """Path of one split of one corpus."""
  if corpus not in CORPORA:
    raise ValueError(f"corpus={corpus!r} is unknown: use one of {sorted(CORPORA)}.")
  if split not in SPLITS:
    raise ValueError(f"split={split!r} is unknown: use one of {SPLITS}.")
  return os.path.join(data_dir, "corpora", corpus, f"{split}.jsonl")


def vocab_file(directory: str) -> str:
  """Path of the SentencePiece model in `directory` (e.g. <data_dir>/vocab)."""
  return os.path.join(directory, f"{VOCAB_NAME}.model")


def stats_file(directory: str, corpus: str) -> str:
  """Path of a corpus's n-gram statistics in `directory` (e.g. <data_dir>/stats)."""
  return os.path.join(directory, f"{corpus}_ngram.npz")
