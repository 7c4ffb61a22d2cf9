"""Random-init stand-ins of the model family's members (no flags).

Stand-ins have the architecture of each member's training config
(`gin_configs/train/<name>.gin`), which the command reads where it assembles its gin
objects (`gin_flags.family_architectures`) and passes in; so runs on them exercise the
same shapes and step costs as runs on the trained family; only acceptance rates are
meaningless.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import jax

from specdec_jax.experiment.targets.family import FAMILY, SHARED_ENCODER
from specdec_jax.models.t5 import SharedEncoderModel, T5Config, T5Model
from specdec_jax.models.t5.checkpoints import save_hf_checkpoint, save_shared_encoder_checkpoint


def write_stand_ins(output_dir: str, names: Sequence[str],
                    architectures: Mapping[str, T5Config]) -> None:
  """Writes random stand-ins of `names` (members of `FAMILY`) under `output_dir`.

  Members already written there are kept (each member's seed is its place in `FAMILY`,
  so a member written again has the same weights).

  Args:
    output_dir: the stand-ins' models directory.
    names: the members to write.
    architectures: member -> its `T5Config`; every member of `names`, and "target" when
      one of them reads the target's encoder (its width is the target's `d_model`).

  Raises:
    ValueError: a name outside `FAMILY`, or a member without an architecture.
  """
  unknown = sorted(set(names) - set(FAMILY))
  if unknown:
    raise ValueError(f"models {unknown} are not in the family {list(FAMILY)}.")
  needed = {*names, *(["target"] if set(names) & set(SHARED_ENCODER) else [])}
  missing = sorted(needed - set(architectures))
  if missing:
    raise ValueError(f"write_stand_ins: no architecture for {missing}; pass "
                     "gin_flags.family_architectures().")
  for name in names:
    path = os.path.join(output_dir, name)
    if os.path.isfile(os.path.join(path, "config.json")):
      continue
    cfg = architectures[name]
    rng = jax.random.PRNGKey(FAMILY.index(name))
    if name in SHARED_ENCODER:
      model = SharedEncoderModel(cfg, architectures["target"].d_model)
      save_shared_encoder_checkpoint(path, model, jax.device_get(model.init_params(rng)))
    else:
      save_hf_checkpoint(path, cfg, jax.device_get(T5Model(cfg).init_params(rng)))
    print(f"{path}: d_model {cfg.d_model}, {cfg.num_layers} layers, vocab {cfg.vocab_size}")
