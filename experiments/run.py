"""Measures speculative against baseline sampling over a gin-configured grid of points.

  python -m experiments.run --gin_file=gin_configs/quickstart.gin \
      [--gin.Experiment.gammas=[1,2,3]] [--gin_bindings="Experiment.seed = 1"] \
      [--output_dir=results/quickstart_t5]

Everything about a run is `specdec_jax.experiment.settings.Experiment`, bound in
gin (its shared fields also by `Settings.*`). The run is checked before any
work, then each point (task, batch size, draft, temperature, gamma) is measured
and appended to `<output_dir>/results.jsonl` atomically; points already there
are skipped, so an interrupted run resumes where it stopped
(`specdec_jax.experiment.runner`). `python -m experiments.analyze` turns the
file into tables and figures. A gin file that binds `Suite.experiments` (a list of
gin files) measures each of them in turn (`specdec_jax.experiment.suite`).
"""

from __future__ import annotations

import os

from absl import app, flags

from specdec_jax import compilation_cache, distributed, partitioning
from specdec_jax.experiment import gin_flags, results_io, runner, settings, suite, tree_point
from specdec_jax.experiment import measure as measure_lib
from specdec_jax.experiment.record import PointRow

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where results.jsonl goes (default runs/<Experiment.name>: your own "
    "measurements; the committed reference rows in results/<name> are only read).")

_COMPILATION_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", compilation_cache.default_dir(),
    "Persistent XLA cache: a rerun reads its compiled programs back ('' = off).")

_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None,
    "host:port of process 0 for a multi-process run (automatic on Cloud TPU VMs).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (0 writes results).")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  distributed.maybe_initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  compilation_cache.enable(_COMPILATION_CACHE_DIR.value)
  bindings = gin_flags.GIN_BINDINGS.value
  files = gin_flags.listed_experiments(gin_flags.GIN_FILE.value, bindings)
  if files is None:  # One experiment.
    exp = gin_flags.load_experiment(gin_flags.GIN_FILE.value, bindings)
    measure(exp, gin_flags.placement(), _OUTPUT_DIR.value)
    return
  if _OUTPUT_DIR.value:
    raise app.UsageError("--output_dir is for one experiment; a suite writes each one's rows "
                         "to runs/<Experiment.name>/.")
  for gin_file in files:
    try:
      exp = gin_flags.load_experiment([gin_file], bindings)
    except suite.MISSING_MODEL as e:
      print(f"\n{gin_file}: not measured, its model is missing: {e}\n", flush=True)
      continue
    measure(exp, gin_flags.placement(), None)  # Its own gin file's mesh and rules.


def measure(exp: settings.Experiment, placement: partitioning.Placement,
            output_dir: str | None) -> None:
  """Measures one experiment's missing points on `placement` and prints its table."""
  output_dir = output_dir or os.path.join(runner.RUNS_ROOT, exp.name)
  path = runner.run(exp, output_dir, greedy=measure_lib.GreedyCheck(), placement=placement)
  planned = {p.key for p in settings.plan(exp)}
  rows = [PointRow.from_json(r) for r in results_io.read_rows(path)
          if results_io.row_key(r) in planned]
  reference_path = os.path.join(runner.RESULTS_ROOT, exp.name, results_io.RESULTS_FILE)
  reference = ([] if os.path.abspath(reference_path) == os.path.abspath(path)
               else [PointRow.from_json(r) for r in results_io.read_rows(reference_path)])
  env = rows[0].environment if rows else {}
  print(f"\n{exp.name}: {len(rows)} points on {env.get('cpu_model', '?')} x "
        f"{env.get('cpu_count', '?')} ({env.get('backend', '?')}), batch sizes "
        f"{sorted({r.batch_size for r in rows})}; reference: {reference_path}\n")
  print(runner.summary_table(rows, reference))
  tree_rows = [tree_point.TreeRow.from_json(r) for r in results_io.read_rows(
      os.path.join(output_dir, tree_point.TREES_FILE))
      if (settings.AUTO if r["shape_auto"] else r["shape"]) == exp.tree]
  if tree_rows:
    print(f"\nThe tree {exp.tree} beside the chain, same draft and examples:\n")
    print(tree_point.tree_table(tree_rows))
  print(f"\n{runner.time_split_line(rows)}")
  print(f"\nRows: {path} (rerunning resumes; delete it to measure again). Tables and figures: "
        f"python -m experiments.analyze --results_dir={output_dir}")


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
