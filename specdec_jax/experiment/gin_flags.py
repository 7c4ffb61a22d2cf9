"""Where the commands assemble their gin objects: the shared flags, parsing, and building.

T5X binds gin where the program is assembled and passes objects down; so do we. A
command parses its files and bindings here (`parse_gin`), builds its `Settings` or
`Experiment` here (`load_settings`, `load_experiment`, `build_experiment`), with the
gin-configurable fields they hold (`PromptCache`, `NgramFit`), its device mesh and axis
rules (`placement`), the family's architectures that stand-ins are built with
(`family_architectures`), and reads its `suite.Suite` here (`listed_experiments`); the
library below takes those objects as arguments and reads no gin. `--gin.NAME=VALUE`
arguments (T5X style) are read as `--gin_bindings`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import gin
from absl import app, flags

from specdec_jax import partitioning
from specdec_jax.data import layout
from specdec_jax.experiment import runner, settings, suite
from specdec_jax.experiment.targets import family
from specdec_jax.models.t5 import T5Config
from specdec_jax.training.model_config import model_config

GIN_FILE = flags.DEFINE_multi_string("gin_file", [], "Gin files, applied in order.")
GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin bindings, e.g. 'Experiment.gammas = [1, 2]'; also --gin.NAME=VALUE.")

GIN_PREFIX = "--gin."
# The family's training configs: each member's architecture (`family_architectures`).
TRAIN_CONFIGS = os.path.join(layout.REPO_ROOT, "gin_configs", "train")


def split_gin_args(argv: list[str]) -> tuple[list[str], list[str]]:
  """Separates T5X-style `--gin.NAME=VALUE` arguments from the rest.

  Returns:
    (argv without them, bindings "NAME=VALUE").
  """
  rest, bindings = [], []
  for arg in argv:
    if arg.startswith(GIN_PREFIX):
      binding = arg[len(GIN_PREFIX):]
      if "=" not in binding:
        raise app.UsageError(f"{arg!r} has no value; write --gin.NAME=VALUE.")
      bindings.append(binding)
    else:
      rest.append(arg)
  return rest, bindings


def parse_flags(argv: list[str]) -> list[str]:
  """`app.run`'s flags parser, with `--gin.NAME=VALUE` read as `--gin_bindings`."""
  rest, bindings = split_gin_args(argv)
  return flags.FLAGS(rest + [f"--gin_bindings={b}" for b in bindings])


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
  """Parses gin files (repo-relative includes work from any folder) and bindings afresh.

  Raises:
    ValueError: a bad file or binding (the message says where to look).
  """
  gin.clear_config()
  gin.add_config_file_search_path(layout.REPO_ROOT)
  try:
    # Not finalized: a locked config would refuse the configurables that modules
    # imported later in the same process define (the training driver in the tests).
    gin.parse_config_files_and_bindings(gin_files, bindings, finalize_config=False)
  except (ValueError, KeyError, SyntaxError) as e:
    raise ValueError(f"Bad gin configuration ({e}). Check the names against "
                     "specdec_jax/experiment/settings.py (Settings, Experiment) and the files "
                     "in gin_configs/.") from e


def load_settings(gin_files: Sequence[str], bindings: Sequence[str]) -> settings.Settings:
  """The validated `Settings` of gin files and bindings (`--gin.Settings.FIELD=VALUE`)."""
  parse_gin(gin_files, bindings)
  shared = settings.Settings()
  settings.validate_settings(shared)
  return shared


def _bound(name: str) -> bool:
  try:
    gin.query_parameter(name)
  except ValueError:  # Not bound.
    return False
  return True


def build_experiment(**fields: Any) -> settings.Experiment:
  """The `Experiment` of the parsed gin config, `fields` passed over its bindings.

  A shared field (`Settings`) that `Experiment` leaves unbound takes the `Settings`
  binding, so `--gin.Settings.gamma=5` reaches a run that binds no `Experiment.gamma`.

  Raises:
    ValueError: a required field (`name`, `drafts`) is bound nowhere.
  """
  shared = settings.Settings()
  inherited = {f.name: getattr(shared, f.name) for f in dataclasses.fields(settings.Settings)
               if _bound(f"Settings.{f.name}") and not _bound(f"Experiment.{f.name}")}
  try:
    return settings.Experiment(**{**inherited, **fields})
  except TypeError as e:
    raise ValueError(f"Experiment is incomplete ({e}); bind it in a gin file, e.g. "
                     "Experiment.name = 'mine' and Experiment.drafts = ['draft_small'].") from e


def load_experiment(gin_files: Sequence[str], bindings: Sequence[str]) -> settings.Experiment:
  """Parses the gin files and bindings afresh; the `Experiment` checked before any work
  (`runner.prepare`), on random-init stand-ins of the family's architectures
  (`family_architectures`) where it asks for them and its target is missing. The
  command's gin stays parsed (for `placement`)."""
  parse_gin(gin_files, bindings)
  exp = build_experiment()
  if not exp.stand_ins_when_missing:
    return runner.prepare(exp)
  architectures = family_architectures()
  parse_gin(gin_files, bindings)  # Reading the architectures cleared the command's config.
  return runner.prepare(exp, architectures)


def family_architectures(names: Sequence[str] = family.FAMILY) -> dict[str, T5Config]:
  """Each member's `T5Config`: `model_config()` of its training config
  (`gin_configs/train/<name>.gin`; only the architecture, the training settings'
  configurables are skipped). Leaves no gin config parsed: parse the command's after.

  Raises:
    ValueError: a member without a training config, or a bad one.
  """
  out = {}
  try:
    for name in names:
      path = os.path.join(TRAIN_CONFIGS, f"{name}.gin")
      if not os.path.isfile(path):
        raise ValueError(f"{name!r} has no training config ({path}); the stand-ins' shapes "
                         "come from gin_configs/train/<name>.gin.")
      gin.clear_config()
      gin.add_config_file_search_path(layout.REPO_ROOT)
      gin.parse_config_file(path, skip_unknown=True)
      out[name] = model_config()
  finally:
    gin.clear_config()
  return out


def placement() -> partitioning.Placement:
  """The device mesh and axis rules of the parsed gin config (`make_mesh.X`,
  `axis_rules.X`, `draft_axis_rules.X`), built once; call it after parsing the command's
  gin (`load_settings`, `load_experiment`) and pass it down.

  Raises:
    ValueError: a mesh the devices cannot make, or a rule naming no mesh axis.
  """
  rules = partitioning.axis_rules()
  return partitioning.Placement(partitioning.make_mesh(), rules,
                                partitioning.draft_axis_rules(rules))


def listed_experiments(gin_files: Sequence[str], bindings: Sequence[str]
                       ) -> tuple[str, ...] | None:
  """The gin files a suite lists (`suite.Suite`); None when `gin_files` bind no `Suite`
  (one experiment).

  Raises:
    ValueError: a bad gin file or binding, or a suite that lists nothing.
  """
  parse_gin(gin_files, bindings)
  if not _bound("Suite.experiments"):
    return None
  listed = suite.Suite().experiments
  if not listed:
    raise ValueError(f"Suite.experiments is empty in {list(gin_files)}: list gin files.")
  return tuple(listed)
