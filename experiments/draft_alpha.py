"""A trained decoder-only draft's alpha along its own training pairs and along the held-out
validation pairs, teacher-forced as its training tracks it: a draft that fits its training
outputs far better than held-out ones is short of data, one that fits both alike is short
of capacity or of steps (`train_student.teacher_forced_alpha`).

  python -m experiments.draft_alpha --gin_file=gin_configs/train/draft_smollm2_eagle.gin \
      --draft=assets/models/draft_smollm2_eagle \
      [--output=results/smollm2_eagle_draft/generalization.json]

The gin file is the draft's recipe (its target, tasks and signals roots); the signals are
the ones its header's commands make.
"""

from __future__ import annotations

import json

import gin
from absl import app, flags

from specdec_jax import atomic_io
from specdec_jax.experiment import gin_flags
from specdec_jax.training.train_student import StudentTrainConfig, teacher_forced_alpha

_DRAFT = flags.DEFINE_string("draft", None, "The exported draft's directory.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the estimates to this JSON file.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _DRAFT.value:
    raise app.UsageError("--draft is required (an exported draft, e.g. "
                         "assets/models/draft_smollm2_eagle).")
  gin.parse_config_files_and_bindings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  config = StudentTrainConfig()
  estimates = {"draft": _DRAFT.value, "gin_file": gin_flags.GIN_FILE.value,
               **teacher_forced_alpha(_DRAFT.value, config)}
  text = json.dumps(estimates, indent=1)
  print(text)
  if _OUTPUT.value:
    atomic_io.atomic_write_text(_OUTPUT.value, text + "\n")


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
