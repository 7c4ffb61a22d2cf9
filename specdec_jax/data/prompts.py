"""The examples a run measures on: text pairs, and fixed-length token batches.

Examples come from the prepared corpora (`<data_dir>/corpora/<task>/<split>.jsonl`)
when they exist, else from the committed `assets/prompts/<task>_test.jsonl`
(the first test examples of each corpus), so a fresh checkout runs too.
Tokenised with SentencePiece directly (no gin, seqio or TensorFlow: the device
check reads this module). `python -m specdec_jax.data.prepare --export_assets`
(re)writes assets/prompts/ from the prepared data (`write_committed_prompts`).
"""

from __future__ import annotations

import json
import os

import numpy as np

from specdec_jax import atomic_io
from specdec_jax.data import chat_prompts, corpora, layout

PROMPTS_DIR = os.path.join(layout.ASSETS_DIR, "prompts")
PROMPTS_SPLIT = "test"
# The committed SentencePiece model every shipped model was trained with, and its ids.
VOCAB_PATH = layout.vocab_file(os.path.join(layout.ASSETS_DIR, "vocab"))
EOS_ID = 1
PAD_ID = 0
PROMPTS_PER_TASK = 64  # Committed examples per corpus: enough for every gin config.


def prompts_file(task: str) -> str:
  return os.path.join(PROMPTS_DIR, f"{task}_{PROMPTS_SPLIT}.jsonl")


def _corpus(task: str) -> str:
  """The corpus a task reads: itself, or a chat task's (`chat_prompts.TASKS`)."""
  return task if task in layout.CORPORA else chat_prompts.task(task).corpus


def _task_rows(task: str, rows: list) -> list:
  """The rows (with an `inputs` text) a task uses: a chat task's long enough sources."""
  if task in layout.CORPORA:
    return rows
  min_words = chat_prompts.task(task).min_words
  inputs = (r.inputs if hasattr(r, "inputs") else r["inputs"] for r in rows)
  return [r for r, text in zip(rows, inputs, strict=True) if len(text.split()) >= min_words]


def load_examples(task: str, split: str,
                  num_examples: int | None) -> tuple[list[tuple[str, str]], str]:
  """The first `num_examples` (input with task prefix, reference) pairs of a split (None: all).

  A chat task that is not a corpus (`chat_prompts.TASKS`: "explain") reads its
  corpus's examples whose source is long enough, with that corpus's prefix (a chat
  target replaces it by the task's instruction).

  Returns:
    The pairs and the file they were read from.

  Raises:
    FileNotFoundError / ValueError: no source holds enough examples (the message
      says how to get them).
  """
  corpus = _corpus(task)
  prefix = layout.CORPORA[corpus].prefix
  prepared = layout.corpus_file(layout.default_data_dir(), corpus, split)
  if os.path.exists(prepared):
    rows, source = _task_rows(task, corpora.read_jsonl(prepared))[:num_examples], prepared
    pairs = [(prefix + ex.inputs, ex.targets) for ex in rows]
  else:
    source = prompts_file(task)
    if split != PROMPTS_SPLIT or not os.path.exists(source):
      raise FileNotFoundError(
          f"No examples for task={task!r}, split={split!r}: {prepared!r} is missing (run "
          "`python -m specdec_jax.data.prepare`) and the committed prompts cover only "
          f"split={PROMPTS_SPLIT!r} ({source}).")
    with open(source, encoding="utf-8") as f:
      rows = [json.loads(line) for line in f if line.strip()]
    pairs = [(prefix + row["inputs"], row["targets"]) for row in rows[:num_examples]]
  if num_examples is not None and len(pairs) < num_examples:
    raise ValueError(f"Experiment.num_examples={num_examples} but {source} holds only "
                     f"{len(pairs)} examples of {task!r}; lower num_examples.")
  return pairs, source


def tokenize(processor, texts: list[str], input_len: int) -> np.ndarray:
  """int32 `[len(texts), input_len]`: pieces cut to input_len - 1, then EOS, then 0-padding.

  Args:
    processor: a `sentencepiece.SentencePieceProcessor`.
    texts: the inputs (task prefix included).
    input_len: the fixed length.
  """
  out = np.full((len(texts), input_len), PAD_ID, np.int32)
  for i, ids in enumerate(processor.encode(texts)):
    ids = ids[:input_len - 1] + [EOS_ID]
    out[i, :len(ids)] = ids
  return out


def write_committed_prompts(data_dir: str) -> list[str]:
  """Rewrites `PROMPTS_DIR` from the test splits prepared in `data_dir`; returns what it did."""
  done = []
  for task in {**layout.CORPORA, **chat_prompts.TASKS}:
    path = layout.corpus_file(data_dir, _corpus(task), PROMPTS_SPLIT)
    rows = [{"id": ex.id, "inputs": ex.inputs, "targets": ex.targets}
            for ex in _task_rows(task, corpora.read_jsonl(path))[:PROMPTS_PER_TASK]]
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
    atomic_io.atomic_write_bytes(prompts_file(task), text.encode("utf-8"))
    done.append(f"{prompts_file(task)}: {len(rows)} examples from {path}")
  return done
