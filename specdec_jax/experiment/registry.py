"""The target kinds a run may name (`Settings.target_kind`), each with its drafts.

One entry per kind of target model (`targets.TargetKind`: its checks, its
loader, its draft kinds). `settings.validate` checks a run's target and drafts
through it, the runner loads and builds through it; a new model is one more
entry here, pointing at its own module.
"""

from __future__ import annotations

from specdec_jax.experiment import llama_target, t5_target
from specdec_jax.experiment.targets import TargetKind

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
