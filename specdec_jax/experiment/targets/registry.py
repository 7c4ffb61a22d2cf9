"""The target kinds a run may name (`Settings.target_kind`), each with its drafts.

One entry per kind of target model (`targets.TargetKind`: its checks, its
loader, its draft kinds). `check` checks a run's target and drafts through
it, the runner loads and builds through it; a new model is one more entry here,
pointing at its own module.
"""

from __future__ import annotations

from specdec_jax.experiment import settings
from specdec_jax.experiment.targets import llama_target, t5_target
from specdec_jax.experiment.targets.interface import TargetKind

TARGET_KINDS: dict[str, TargetKind] = {
    kind.name: kind for kind in (t5_target.KIND, llama_target.KIND)}


def target_kind(name: str, field: str = "Settings.target_kind") -> TargetKind:
  """The kind named `name`.

  Raises:
    ValueError: no such kind (the message names `field` and lists the kinds).
  """
  if not isinstance(name, str) or name not in TARGET_KINDS:
    raise ValueError(f"{field}={name!r} is not a target kind; use one of "
                     f"{sorted(TARGET_KINDS)}.")
  return TARGET_KINDS[name]


def check(exp: settings.Experiment) -> TargetKind:
  """Checks a run (everything but its weights) and returns its target kind.

  Its fields (`settings.validate`), then through its kind: that the kind
  exists, that every draft spec names a draft kind of it, that the target
  exists and is sound, that it scores trees if the run measures one
  (`Experiment.tree`), and that every draft (and the tokenizer) shares the
  target's vocabulary. Reads configs, file headers and n-gram statistics only,
  no weights.

  Raises:
    ValueError / FileNotFoundError: naming the field and the fix.
  """
  settings.validate(exp)
  kind = target_kind(exp.target_kind, "Experiment.target_kind")
  draft_kinds = [kind.draft_kind(spec) for spec in exp.drafts]  # Unknown specs first.
  if exp.tree is not None and kind.tree_proposer is None:
    raise ValueError(f"Experiment.tree={exp.tree!r}: a {kind.name!r} target scores no token "
                     "trees; set Experiment.tree = None.")
  target_vocab = kind.check(exp)
  for spec, draft_kind in zip(exp.drafts, draft_kinds, strict=True):
    draft_kind.check(exp, spec, target_vocab)
  return kind
