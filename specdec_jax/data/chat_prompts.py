"""Instruction prompts for a chat model, built from our own data in its chat template.

A decoder-only, instruction-tuned target (a GGUF Llama) reads each example as one
user turn: a task's instruction, then the example's source text, rendered by the
model's own chat template (`gguf_loader.GGUFVocabulary.chat_prompt`) up to where
the assistant's reply begins. A source is cut at a word boundary until the whole
prompt fits `width` tokens. The tasks (`TASKS`) read the prepared corpora's
sources, split as the corpora are (by page), so a task's test prompts come from
pages that no training or validation prompt saw:

  * "mansum": summarize a man page's DESCRIPTION in one sentence;
  * "explain": explain a LibreOffice help paragraph in a few sentences (the En-De
    corpus's English side, paragraphs of at least `min_words` words): answers of
    up to ~128 tokens, the longer English task;
  * "ende": translate into German (Table 3's row; SmolLM2-135M cannot translate).

The `llama_gguf` target kind (`experiments.run`, `experiments.measure_alpha`) and the
distillation commands build their prompts here, so all of them read the same
prompts of the same examples.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from specdec_jax.data import layout


@dataclasses.dataclass(frozen=True)
class ChatTask:
  """One instruction task over a prepared corpus.

  Attributes:
    name: the task's name (a distillation directory's, an experiment's task).
    corpus: the corpus whose `inputs` are the sources (`layout.CORPORA`).
    instruction: put before each source in the user turn.
    min_words: sources with fewer words are not used.
  """

  name: str
  corpus: str
  instruction: str
  min_words: int = 1


TASKS = {
    "ende": ChatTask("ende", "ende", "Translate to German: "),
    "mansum": ChatTask("mansum", "mansum", "Summarize in one sentence: "),
    "explain": ChatTask("explain", "ende", "Explain in a few sentences: ", min_words=20),
}


def task(name: str) -> ChatTask:
  """The `ChatTask` called `name`.

  Raises:
    ValueError: no such task.
  """
  if name not in TASKS:
    raise ValueError(f"task={name!r} has no chat instruction; use one of {sorted(TASKS)}.")
  return TASKS[name]


def chat_prompt(vocabulary: Any, tokenizer: Any, task_name: str, source: str, width: int
                ) -> list[int]:
  """The token ids of one example's chat prompt, at most `width` of them.

  Args:
    vocabulary: the model's `gguf_loader.GGUFVocabulary` (its chat template).
    tokenizer: `vocabulary.tokenizer()` (built once by the caller).
    task_name: a key of `TASKS`.
    source: the example's source text, without any task prefix.
    width: the most tokens the prompt may have.

  Raises:
    ValueError: `task_name` has no instruction.
  """
  instruction = task(task_name).instruction
  words = source.split()
  while True:
    content = instruction + " ".join(words)
    ids = tokenizer.encode(vocabulary.chat_prompt([{"role": "user", "content": content}])).ids
    if len(ids) <= width or len(words) <= 1:
      break
    words = words[:max(1, len(words) - max(1, (len(ids) - width) // 2))]
  return ids[:width]


def shared_prefix(vocabulary: Any, tokenizer: Any) -> list[int]:
  """The token ids every chat prompt starts with (the template's system turn and the user
  turn's opening): the common prefix of two prompts whose contents share no first token.
  """
  first, second = (tokenizer.encode(vocabulary.chat_prompt([{"role": "user", "content": c}])).ids
                   for c in ("Alpha", "7"))
  length = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                min(len(first), len(second)))
  return first[:length]


def task_sources(task_name: str, split: str, data_dir: str | None = None
                 ) -> tuple[list[str], list[int]]:
  """A task's sources in a prepared split, and their rows in the corpus file.

  Returns:
    The sources (file order, without any task prefix) and each one's row in
    `<split>.jsonl` of the task's corpus.

  Raises:
    ValueError: no such task.
    FileNotFoundError: the split is not prepared (`python -m specdec_jax.data.prepare`).
  """
  spec = task(task_name)
  path = layout.corpus_file(data_dir or layout.default_data_dir(), spec.corpus, split)
  try:
    with open(path, encoding="utf-8") as f:
      rows = [json.loads(line)["inputs"] for line in f if line.strip()]
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{path} is missing: prepare the corpora first (python -m "
                            "specdec_jax.data.prepare).") from e
  kept = [i for i, text in enumerate(rows) if len(text.split()) >= spec.min_words]
  return [rows[i] for i in kept], kept


def split_sources(task_name: str, split: str, count: int) -> list[str]:
  """`count` of a task's sources evenly spaced through a prepared split (all if fewer).

  Raises:
    ValueError, FileNotFoundError: see `task_sources`.
  """
  sources, _ = task_sources(task_name, split)
  picks = np.linspace(0, len(sources) - 1, min(count, len(sources))).round().astype(int)
  return [sources[i] for i in picks]


def build_prompts(vocabulary: Any, task_name: str, split: str, count: int, width: int
                  ) -> list[list[int]]:
  """Chat prompts of `count` examples evenly spaced through a split, each at most `width`
  tokens (`split_sources`, `chat_prompt`)."""
  tokenizer = vocabulary.tokenizer()
  return [chat_prompt(vocabulary, tokenizer, task_name, text, width)
          for text in split_sources(task_name, split, count)]
