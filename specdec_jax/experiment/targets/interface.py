"""What a measurement run needs from a kind of target model and its drafts: one interface.

`experiments.run` and `experiments.measure_alpha` measure any target behind a
`decoding.scorer.Scorer`. A
target kind (`TargetKind`, named by `Settings.target_kind` in gin and listed in
`experiment.targets.registry`) says how a run uses one family of targets:

  * `check(exp)`: the run's target (and tokenizer) are there and sound, before
    any weights load; returns the target's vocabulary size;
  * `load(settings, placement)`: the `LoadedTarget`, on the mesh and by the rules of the
    `partitioning.Placement` the command built: its scorer, EOS id, how task
    examples become its inputs (`tokenize`, described by `prompt_format`) and how its
    token ids read (`pieces`);
  * `drafts`: the `DraftKind`s it can build, each matching the specs
    (`Experiment.drafts` entries) that name it, checked without weights and
    built from the loaded target.

The T5 family is `experiment.targets.t5_target`, the decoder-only GGUF Llama
`experiment.targets.llama_target`. A new model enters with its own files (a model, its
scorer, its loader, its kind) and one entry in `registry.TARGET_KINDS`; the
runner, the settings' checks, the timing harness and the decoding loops stay
as they are.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from specdec_jax.decoding.drafts import Draft, PromptLookupDraft, ScorerDraft
from specdec_jax.decoding.proposers import DraftBranches, Proposer
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.partitioning import Placement

if TYPE_CHECKING:
  from specdec_jax.experiment.settings import Experiment, Settings


@dataclasses.dataclass(frozen=True)
class LoadedTarget(abc.ABC):
  """A target loaded for a run, and what a run asks of it.

  Attributes:
    scorer: the target's `Scorer` (parameters prepared once, placed on the mesh).
    eos_id: the end-of-sequence id the decoders stop at.
    encoder_width: the width of the encoder outputs a draft may read
      (`validation.check_draft`), None for a target without an encoder.
    settings: the settings it was loaded with (drafts read their paths and dtypes).
    placement: the device mesh its arrays live on and the rules they are sharded by (its
      drafts are sharded by `placement.draft_rules`).
  """

  scorer: Scorer
  eos_id: int
  encoder_width: int | None
  settings: Settings
  placement: Placement

  @property
  def mesh(self) -> jax.sharding.Mesh:
    """The device mesh its arrays live on."""
    return self.placement.mesh

  @abc.abstractmethod
  def tokenize(self, task: str, texts: Sequence[str], width: int) -> np.ndarray:
    """int32 `[len(texts), width]`, 0-padded: the target's inputs for `task`'s examples.

    Args:
      task: the corpus ("ende", "mansum").
      texts: its examples' inputs as `prompts.load_examples` gives them (the
        task prefix included).
      width: the inputs' length (`Settings.input_len`).
    """

  @abc.abstractmethod
  def pieces(self, ids: list[int]) -> list[str]:
    """How each token id reads (for the saved example of a row)."""

  @abc.abstractmethod
  def prompt_format(self, task: str) -> str:
    """How `tokenize` makes `task`'s inputs, in words (results files record it)."""

  @property
  def ngram_fit(self) -> tuple[str, int] | None:
    """How this target's unigram / bigram drafts were fit on its own outputs, in words, and
    the tokens they were fit on; None where they are not fit on its outputs (or not yet)."""
    return None


@dataclasses.dataclass(frozen=True)
class DraftKind:
  """One kind of draft: the specs that name it, its check before any weights load, its build.

  Attributes:
    name: how messages name the kind, e.g. "prompt_lookup", "layer_skip_<L>".
    matches: spec -> whether the spec names this kind.
    build: (target, spec, task) -> the draft, on the target's mesh; `task` is
      "" unless `per_task`.
    check: (experiment, spec, target vocabulary size) -> None; raises
      ValueError / FileNotFoundError naming `Experiment.drafts` and the fix.
      Reads no weights.
    per_task: whether the draft differs per task (built once per task, else
      once per run).
  """

  name: str
  matches: Callable[[str], bool]
  build: Callable[[LoadedTarget, str, str], Draft]
  check: Callable[[Experiment, str, int], None] = lambda exp, spec, vocab: None
  per_task: bool = False


def draft_branches(draft: Draft, k: int, depth: int) -> Proposer:
  """A model draft's top-`k` branches of `depth` tokens (`Experiment.tree`), the draft
  scoring trees with its own scorer (`proposers.DraftBranches`).

  Raises:
    ValueError: the draft is a table look-up (prompt lookup, n-grams): it has no top-k.
  """
  if isinstance(draft, ScorerDraft):
    return DraftBranches(draft, k=k, depth=depth)
  raise ValueError(f"Experiment.tree: a {type(draft).__name__} has no top-k to branch on; "
                   "measure trees with a model draft, or set Experiment.tree = None.")


@dataclasses.dataclass(frozen=True)
class TargetKind:
  """A kind of target model: its checks, its loader and its drafts.

  Attributes:
    name: its `Settings.target_kind` value.
    check: experiment -> the target's vocabulary size; raises ValueError /
      FileNotFoundError naming the field and the fix. Reads no weights.
    load: (settings, placement) -> the `LoadedTarget`, on `placement.mesh`, sharded by
      `placement.rules`.
    drafts: the draft kinds, the first whose `matches` accepts a spec builds it.
    stand_ins: (experiment, architectures) -> the experiment on random-init stand-ins
      when its target is missing (`Experiment.stand_ins_when_missing`);
      `architectures` maps each member of the family to its model config, read by the
      command (`gin_flags.family_architectures`). None: the kind has none.
    tree_proposer: (draft, k, depth) -> the `proposers.Proposer` of the draft's top-k
      branches of `depth` tokens (`Experiment.tree`); raises ValueError for a draft
      that has no top-k. None: the kind's scorer scores no trees.
  """

  name: str
  check: Callable[[Experiment], int]
  load: Callable[[Settings, Placement], LoadedTarget]
  drafts: tuple[DraftKind, ...]
  stand_ins: Callable[[Experiment, Mapping[str, Any]], Experiment] | None = None
  tree_proposer: Callable[[Draft, int, int], Proposer] | None = None

  def draft_kind(self, spec: str) -> DraftKind:
    """The kind of draft `spec` names.

    Raises:
      ValueError: no draft kind of this target matches it (the message lists them).
    """
    for kind in self.drafts:
      if kind.matches(spec):
        return kind
    raise ValueError(f"Experiment.drafts has {spec!r}, which no draft of a {self.name!r} target "
                     f"is: use one of: {'; '.join(kind.name for kind in self.drafts)}.")


PROMPT_LOOKUP = DraftKind(
    name="prompt_lookup", matches=lambda spec: spec == "prompt_lookup",
    build=lambda target, spec, task: PromptLookupDraft(target.scorer.vocab_size))


def draft_key(kind: DraftKind, spec: str, task: str) -> tuple[str, str]:
  """What identifies a built draft within a run: its spec, and its task if `per_task`."""
  return spec, task if kind.per_task else ""


def require(ok: bool, message: str) -> None:
  """Raises ValueError(message) unless `ok` (the kinds' checks)."""
  if not ok:
    raise ValueError(message)
