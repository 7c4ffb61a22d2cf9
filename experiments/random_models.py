"""Writes randomly initialised stand-ins of the model family in HF format.

  python -m experiments.random_models --output_dir=/tmp/specdec_random_models

Each model has the architecture of its training config
(`gin_configs/train/<name>.gin`), so runs on the stand-ins exercise the same
shapes and step costs as runs on the trained family; only acceptance rates
are meaningless. Point a run at them with
`--gin.Experiment.models_dir="'/tmp/specdec_random_models'"`.
"""

from __future__ import annotations

import os

import gin
import jax
from absl import app, flags

from experiments import train
from specdec_jax.checkpoints import save_hf_checkpoint
from specdec_jax.data import layout
from specdec_jax.models import T5Model

FAMILY = ("target", "draft_small", "draft_base", "draft_large", "draft_distilled")
TRAIN_CONFIGS = os.path.join(layout.REPO_ROOT, "gin_configs", "train")

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory of the stand-in checkpoints.",
                                  required=True)
_MODELS = flags.DEFINE_list("models", list(FAMILY), "Which members to write.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the first model (the others count up).")


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
    gin.parse_config_file(os.path.join(TRAIN_CONFIGS, f"{name}.gin"))
    cfg = train.model_config()
    params = jax.device_get(T5Model(cfg).init_params(
        jax.random.PRNGKey(seed + FAMILY.index(name))))
    save_hf_checkpoint(path, cfg, params)
    print(f"{path}: d_model {cfg.d_model}, {cfg.num_layers} layers, vocab {cfg.vocab_size}")
  gin.clear_config()


def main(argv: list[str]) -> None:
  del argv
  try:
    write_stand_ins(_OUTPUT_DIR.value, _MODELS.value, _SEED.value)
  except ValueError as e:
    raise app.UsageError(f"--models: {e}") from e


if __name__ == "__main__":
  app.run(main)
