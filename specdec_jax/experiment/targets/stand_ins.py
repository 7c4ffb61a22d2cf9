"""Random-init stand-ins of the model family's members (no flags).

Stand-ins have the architecture of each member's training config
(`gin_configs/train/<name>.gin`), so runs on them exercise the same shapes and
step costs as runs on the trained family; only acceptance rates are meaningless.
"""

from __future__ import annotations

import os

import gin
import jax

from specdec_jax.data import layout
from specdec_jax.experiment.targets.family import FAMILY, SHARED_ENCODER
from specdec_jax.models.t5 import SharedEncoderModel, T5Config, T5Model
from specdec_jax.models.t5.checkpoints import save_hf_checkpoint, save_shared_encoder_checkpoint
from specdec_jax.training.model_config import model_config

TRAIN_CONFIGS = os.path.join(layout.REPO_ROOT, "gin_configs", "train")


def write_stand_ins(output_dir: str, names: list[str]) -> None:
  """Writes random stand-ins of `names` (members of `FAMILY`) under `output_dir`.

  Members already written there are kept (each member's seed is its place in `FAMILY`,
  so a member written again has the same weights).
  """
  unknown = sorted(set(names) - set(FAMILY))
  if unknown:
    raise ValueError(f"models {unknown} are not in the family {list(FAMILY)}.")
  for name in names:
    path = os.path.join(output_dir, name)
    if os.path.isfile(os.path.join(path, "config.json")):
      continue
    cfg = _architecture(name)
    rng = jax.random.PRNGKey(FAMILY.index(name))
    if name in SHARED_ENCODER:
      model = SharedEncoderModel(cfg, _architecture("target").d_model)
      save_shared_encoder_checkpoint(path, model, jax.device_get(model.init_params(rng)))
    else:
      save_hf_checkpoint(path, cfg, jax.device_get(T5Model(cfg).init_params(rng)))
    print(f"{path}: d_model {cfg.d_model}, {cfg.num_layers} layers, vocab {cfg.vocab_size}")


def _architecture(name: str) -> T5Config:
  """The T5Config of a member's training config (`gin_configs/train/<name>.gin`)."""
  gin.add_config_file_search_path(layout.REPO_ROOT)
  gin.clear_config()
  try:
    # Only the architecture: the training settings' configurables are not loaded here.
    gin.parse_config_file(os.path.join(TRAIN_CONFIGS, f"{name}.gin"), skip_unknown=True)
    return model_config()
  finally:
    gin.clear_config()
