"""Instruction prompts for a chat model, built from our own data in its chat template.

A decoder-only, instruction-tuned target (`models.llama` from GGUF) reads each
example as one user turn: an instruction, then the example's source text
("Translate to German: <En-De source>", "Summarize in one sentence:
<man-page DESCRIPTION>"), rendered by the model's own chat template
(`gguf_loader.GGUFVocabulary.chat_prompt`) up to where the assistant's reply
begins. A source is cut at a word boundary until the whole prompt fits `width`
tokens. `experiments.alpha_llama` (alpha, Table 3) and the runner's
`llama_gguf` target kind (`experiments.run`) build their prompts here, so both
measure the same prompts of the same examples.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from specdec_jax.data import layout

INSTRUCTIONS = {"ende": "Translate to German: ", "mansum": "Summarize in one sentence: "}


def chat_prompt(vocabulary: Any, tokenizer: Any, task: str, source: str, width: int
                ) -> list[int]:
  """The token ids of one example's chat prompt, at most `width` of them.

  Args:
    vocabulary: the model's `gguf_loader.GGUFVocabulary` (its chat template).
    tokenizer: `vocabulary.tokenizer()` (built once by the caller).
    task: a key of `INSTRUCTIONS`.
    source: the example's source text, without any task prefix.
    width: the most tokens the prompt may have.

  Raises:
    ValueError: `task` has no instruction.
  """
  if task not in INSTRUCTIONS:
    raise ValueError(f"task={task!r} has no chat instruction; use one of {sorted(INSTRUCTIONS)}.")
  words = source.split()
  while True:
    content = INSTRUCTIONS[task] + " ".join(words)
    ids = tokenizer.encode(vocabulary.chat_prompt([{"role": "user", "content": content}])).ids
    if len(ids) <= width or len(words) <= 1:
      break
    words = words[:max(1, len(words) - max(1, (len(ids) - width) // 2))]
  return ids[:width]


def split_sources(task: str, split: str, count: int) -> list[str]:
  """`count` source texts evenly spaced through a prepared split (all if it holds fewer).

  Raises:
    FileNotFoundError: the split is not prepared (`python -m specdec_jax.data.prepare`).
  """
  path = layout.corpus_file(layout.default_data_dir(), task, split)
  try:
    with open(path, encoding="utf-8") as f:
      rows = [json.loads(line)["inputs"] for line in f if line.strip()]
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{path} is missing: prepare the corpora first (python -m "
                            "specdec_jax.data.prepare).") from e
  picks = np.linspace(0, len(rows) - 1, min(count, len(rows))).round().astype(int)
  return [rows[i] for i in picks]


def build_prompts(vocabulary: Any, task: str, split: str, count: int, width: int
                  ) -> list[list[int]]:
  """Chat prompts of `count` examples evenly spaced through a split, each at most `width`
  tokens (`split_sources`, `chat_prompt`)."""
  tokenizer = vocabulary.tokenizer()
  return [chat_prompt(vocabulary, tokenizer, task, text, width)
          for text in split_sources(task, split, count)]
