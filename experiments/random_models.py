"""Writes randomly initialised stand-ins of the model family in HF format.

  python -m experiments.random_models --output_dir=/tmp/specdec_random_models

Each model has the architecture of its training config
(`gin_configs/train/<name>.gin`), so runs on the stand-ins exercise the same
shapes and step costs as runs on the trained family; only acceptance rates
are meaningless. Point a run at them with
`--gin.Experiment.models_dir="'/tmp/specdec_random_models'"`.
"""

from __future__ import annotations

from absl import app, flags

from specdec_jax.harness.family import FAMILY
from specdec_jax.harness.stand_ins import write_stand_ins

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory of the stand-in checkpoints.",
                                  required=True)
_MODELS = flags.DEFINE_list("models", list(FAMILY), "Which members to write.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the first model (the others count up).")


def main(argv: list[str]) -> None:
  del argv
  try:
    write_stand_ins(_OUTPUT_DIR.value, _MODELS.value, _SEED.value)
  except ValueError as e:
    raise app.UsageError(f"--models: {e}") from e


if __name__ == "__main__":
  app.run(main)
