"""The model family's members and random-init stand-ins of them (no flags).

Stand-ins have the architecture of each member's training config
(`gin_configs/train/<name>.gin`), so runs on them exercise the same shapes and
step costs as runs on the trained family; only acceptance rates are meaningless.
"""

from __future__ import annotations

import os

import gin
import jax

from specdec_jax.checkpoints import save_hf_checkpoint
from specdec_jax.data import layout
from specdec_jax.models import T5Model
from specdec_jax.training.model_config import model_config

FAMILY = ("target", "draft_small", "draft_base", "draft_large", "draft_distilled")
DRAFTS = FAMILY[1:]
TRAIN_CONFIGS = os.path.join(layout.REPO_ROOT, "gin_configs", "train")


def write_stand_ins(output_dir: str, names: list[str], seed: int = 0) -> None:
  """Writes random stand-ins of `names` (members of `FAMILY`) under `output_dir`.

  Members already written there are kept (the same seed gives the same weights).
  """
  unknown = sorted(set(names) - set(FAMILY))
  if unknown:
    raise ValueError(f"models {unknown} are not in the family {list(FAMILY)}.")
  gin.add_config_file_search_path(layout.REPO_ROOT)
  for name in names:
    path = os.path.join(output_dir, name)
    if os.path.isfile(os.path.join(path, "config.json")):
      continue
    gin.clear_config()
    # Only the architecture: the training settings' configurables are not loaded here.
    gin.parse_config_file(os.path.join(TRAIN_CONFIGS, f"{name}.gin"), skip_unknown=True)
    cfg = model_config()
    params = jax.device_get(T5Model(cfg).init_params(
        jax.random.PRNGKey(seed + FAMILY.index(name))))
    save_hf_checkpoint(path, cfg, params)
    print(f"{path}: d_model {cfg.d_model}, {cfg.num_layers} layers, vocab {cfg.vocab_size}")
  gin.clear_config()
