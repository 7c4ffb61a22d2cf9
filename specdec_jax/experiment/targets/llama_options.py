"""How a `llama_gguf` target is run: its prompt cache and its n-gram drafts' fit.

Both are gin-configurable (`PromptCache.X`, `NgramFit.X`) and are fields of
`experiment.settings.Settings`, so they are built with the settings where a command
assembles them (`experiment.gin_flags`) and read from there by `llama_target`.
"""

from __future__ import annotations

import dataclasses

import gin


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PromptCache:
  """How the target prefills its prompts (gin: `PromptCache.X`).

  Attributes:
    shared_prefix: prefill the chat template's system turn, the tokens every prompt
      starts with (`chat_prompts.shared_prefix`), once at load and copy it into every
      row (`LlamaScorer.with_prefix`), rather than prefill it per prompt. Both
      decoders use the target's scorer, so both get it. On by default: it measured
      faster (`python -m benchmarks prompt_prefix`; results/README.md).
  """

  shared_prefix: bool = True


@gin.configurable
@dataclasses.dataclass(frozen=True)
class NgramFit:
  """Where the unigram / bigram drafts of a `llama_gguf` target are fit (gin: `NgramFit.X`).

  Attributes:
    split: the split whose examples' chat prompts the target decodes greedily.
    examples: examples per task, evenly spaced through the split.
    batch_size: rows decoded together.
  """

  split: str = "validation"
  examples: int = 32
  batch_size: int = 8
