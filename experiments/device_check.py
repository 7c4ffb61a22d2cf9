r"""The accelerator check: the project's measurements on one GPU or TPU chip, in minutes.

  bash experiments/device_check.sh OUT_DIR                 # the full check, < 8 min on one H200
  bash experiments/device_check.sh OUT_DIR --gin_file=gin_configs/device_check_smoke.gin
  bash experiments/device_check.sh OUT_DIR --regime_map    # the T5 regime map's sweep instead
  PYTHONPATH=. python -m experiments.device_check --output_dir=OUT_DIR [--gin.X=V ...]

The project was built and measured on a 2-core CPU; this measures it on whatever device
jax sees first. What it measures is gin (`--gin_file`, default
`gin_configs/device_check.gin`): the decode runs are `experiments.run` experiments (the
file's `Experiment`, one per `DeviceCheck.runs` entry with that entry's overrides, e.g.
its dtype and drafts), the rest is `DeviceCheck`. In order:

  jax_40101     our smallest loop writes (the baseline's token write, a draft cache layer's
                key and value writes) timed per write in a jitted loop over a small and a
                large buffer, on the default backend and on the CPU: an in-place write
                costs the same at both sizes; the regression of jax#40101 (XLA:CPU, jaxlib
                0.11.1+, updates under 256 bytes) rewrites the whole buffer and scales with
                its size.
  cache_length  the target's one-token step at the decoders' cache and at a long one,
                beside the ratio of the bytes a step reads at each (its weights, encoded
                inputs and cache: `Scorer.init_state` at both lengths): a whole-cache
                rewrite per step shows as a time ratio well above the bytes ratio.
  runs          each run by the runner (`experiment.runner`) into OUT_DIR/<name>/results.jsonl,
                one `PointRow` per point: both decoders interleaved, the speedup, alpha,
                c, T_step and T_verify(k) for k = 1..`DeviceCheck.max_k` (the step
                costs), Theorem 3.8 and the cost model. `GreedyCheck.enforce = False`
                records greedy tokens that differ from the baseline's instead of refusing
                the point: an accelerator's k-token call may round differently from k
                one-token calls (bfloat16, TF32 dots).

No point starts that would end more than `DeviceCheck.budget_s` after the start (at the
pace of the slowest so far); rerun into the same folder to measure the points left. A run
that raises is reported and the next one goes on. OUT_DIR/checks.json holds the first
two sections and the environment, OUT_DIR/tables.md sums everything up, and
`python -m experiments.analyze --results_dir=OUT_DIR/<name>` draws a run's tables and
figures. The timing guard (`specdec_jax.contention`) watches the project's shared CPU;
here it is recorded in every row, not enforced.

`--regime_map` runs, instead, the T5 regime map's sweep (`specdec_jax.regime_map.sweep`
with `REGIME_MAP`'s settings: the public T5 shapes to t5-3b in bfloat16 and our family)
into OUT_DIR/regime_map, then its predictions and tables (`regime_predictions`), and its
figure where matplotlib is installed (elsewhere: `python -m experiments.regime_map
--nomeasure --output_dir=OUT_DIR/regime_map`). The shapes' checkpoints go to
`<data_dir>/regime_map_models` (t5-3b alone is 5.7 GB).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import flax
import gin
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from experiments import accelerator_checks
from specdec_jax import atomic_io, contention, partitioning
from specdec_jax.costs import timing
from specdec_jax.experiment import gin_flags, results_io, runner, settings
from specdec_jax.experiment.measure import GreedyCheck
from specdec_jax.experiment.record import PointRow
from specdec_jax.experiment.targets import registry
from specdec_jax.models.t5 import T5Config, checkpoints
from specdec_jax.regime_map import regime_predictions, sweep

Array = jax.Array

DEFAULT_GIN = os.path.join("gin_configs", "device_check.gin")
CHECKS_FILE = "checks.json"
TABLES_FILE = "tables.md"

# `--regime_map`: the regime map's sweep on the accelerator, in the dtype it is used in there.
REGIME_MAP = sweep.MapSettings(
    shapes=tuple(sweep.SHAPES), dtype="bfloat16", param_dtype="bfloat16",
    timing_calls=16, timing_repeats=5, timing_rounds=5)
REGIME_MAP_DIR = "regime_map"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DeviceCheck:
  """What the check measures besides each run's `Experiment` (gin: `DeviceCheck.X`).

  Attributes:
    runs: the decode runs, in the order measured: each a mapping of `Experiment` fields
      over the gin file's `Experiment`; its "name" is appended to the experiment's
      (`<Experiment.name>_<name>`, the run's folder).
    max_k: T_verify(k) is timed for k = 1..max_k in every run's rows (>= gamma + 1).
    long_cache_len: positions of the cache-length check's long cache.
    write_bytes: (small, large) buffer sizes in bytes of the jax#40101 check.
    write_calls: writes per timed loop of the jax#40101 check.
    budget_s: no point starts that would end later than this many seconds after the start.
  """

  runs: Sequence[Mapping[str, Any]] = ()
  max_k: int = 8
  long_cache_len: int = 2048
  write_bytes: Sequence[int] = (16 << 10, 16 << 20)
  write_calls: int = 256
  budget_s: float = 390.0


def experiments(check: DeviceCheck) -> list[settings.Experiment]:
  """Each run's `Experiment`, its fields checked (its models are `check_models`').

  Raises:
    ValueError: a bad run or setting, naming it and the fix.
  """
  if not check.runs:
    raise ValueError("DeviceCheck.runs is empty: list the decode runs, e.g. "
                     "[{'name': 'float32', 'drafts': ['draft_small']}].")
  fields = {f.name for f in dataclasses.fields(settings.Experiment)}
  out = []
  for i, run in enumerate(check.runs):
    overrides = {k: v for k, v in run.items() if k != "name"}
    unknown = sorted(set(overrides) - fields)
    if unknown or "name" not in run:
      raise ValueError(f"DeviceCheck.runs[{i}] = {dict(run)}: each run needs a 'name' and "
                       f"sets Experiment fields only ({unknown} are not).")
    try:
      exp = gin_flags.build_experiment(**overrides)  # The rest from the gin file.
    except ValueError as e:
      raise ValueError(f"DeviceCheck.runs[{i}]: {e}; bind it in the run or the gin file's "
                       "Experiment.") from e
    exp = dataclasses.replace(exp, name=f"{exp.name}_{run['name']}")
    settings.validate(exp)
    if check.max_k < max(settings.largest_gamma(exp, settings.plan(exp)) + 1, 2):
      raise ValueError(f"DeviceCheck.max_k={check.max_k}: the run {exp.name!r} needs "
                       "T_verify(k) up to its largest gamma + 1; raise max_k.")
    out.append(exp)
  return out


def first_draft_config(exp: settings.Experiment) -> T5Config:
  """The config of the run's first draft, whose cache writes the jax#40101 check times.

  Raises:
    ValueError: that draft is not a T5 checkpoint.
  """
  try:
    return checkpoints.load_model_config(exp.checkpoint_dir(exp.drafts[0]))
  except (OSError, ValueError) as e:
    raise ValueError(f"DeviceCheck.runs[0]: the jax#40101 check writes as its first draft "
                     f"{exp.drafts[0]!r} does, which must be a T5 checkpoint ({e}).") from e


def check_models(exps: Sequence[settings.Experiment]) -> None:
  """Every run's target and drafts are there and sound (`registry.check`; no weights read).

  Raises:
    ValueError / FileNotFoundError: naming the field and the fix.
  """
  for exp in exps:
    registry.check(exp)


# --- The run ----------------------------------------------------------------------------------


def _log(message: str) -> None:
  """A progress line on stderr, stamped with the seconds since the process started."""
  print(f"[{time.monotonic() - _STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


_STARTED = time.monotonic()  # `_log`'s clock; the budget counts from `measure`'s start.


def environment(command: str) -> dict[str, Any]:
  """Where and with what the check ran."""
  return {**timing.environment(), "jaxlib": jaxlib.__version__,
          "flax": flax.__version__, "numpy": np.__version__,
          "devices": [str(d) for d in jax.devices()], "command": command,
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


@dataclasses.dataclass
class Report:
  """What a check measured, as tables.md shows it.

  Attributes:
    environment: `environment()`.
    writes: the jax#40101 rows.
    cache: the cache-length row (None until measured).
    runs: each run's name -> its rows (those measured, this time or before).
    planned: each run's name -> its points.
    failed: each run that raised -> the message.
  """

  environment: dict[str, Any]
  writes: list[accelerator_checks.WriteCheck] = dataclasses.field(default_factory=list)
  cache: accelerator_checks.CacheCheck | None = None
  runs: dict[str, list[PointRow]] = dataclasses.field(default_factory=dict)
  planned: dict[str, int] = dataclasses.field(default_factory=dict)
  failed: dict[str, str] = dataclasses.field(default_factory=dict)

  def checks_json(self) -> dict[str, Any]:
    """checks.json: the environment, the write and cache-length checks."""
    return {"environment": self.environment,
            "jax_40101": [dict(dataclasses.asdict(w), ratio=w.ratio, verdict=w.verdict)
                          for w in self.writes],
            "cache_length": self.cache and dict(dataclasses.asdict(self.cache),
                                                ratio=self.cache.ratio,
                                                bytes_ratio=self.cache.bytes_ratio,
                                                verdict=self.cache.verdict)}


def measure(check: DeviceCheck, exps: Sequence[settings.Experiment], output_dir: str,
            command: str, placement: partitioning.Placement) -> Report:
  """Every section in order, each written as soon as it is measured, every run on
  `placement`; returns the report."""
  deadline = time.monotonic() + check.budget_s
  report = Report(environment(command))
  checks_path = os.path.join(output_dir, CHECKS_FILE)
  env = report.environment
  _log(f"jax {env['jax']} ({env['backend']}: {env['device_kind']}), {len(exps)} runs")
  report.writes = accelerator_checks.check_jax_40101(
      first_draft_config(exps[0]), min((exps[0].dtype, exps[0].param_dtype),
                                       key=lambda d: jnp.dtype(d).itemsize),
      check.write_bytes, check.write_calls, exps[0].timing_repeats, _log)
  atomic_io.write_json(checks_path, report.checks_json())
  with jax.set_mesh(placement.mesh):
    target = registry.target_kind(exps[0].target_kind).load(exps[0], placement)
    report.cache = accelerator_checks.check_cache_length(
        exps[0], target, accelerator_checks.first_batch(exps[0], target), check.max_k,
        check.long_cache_len, _log)
  del target
  atomic_io.write_json(checks_path, report.checks_json())
  for exp in exps:
    directory = os.path.join(output_dir, exp.name)
    report.planned[exp.name] = len(settings.plan(exp))
    try:
      path = runner.run(exp, directory, greedy=GreedyCheck(), placement=placement,
                        max_gamma=check.max_k - 1, deadline=deadline)
    except Exception as e:  # One failing run must not cost the others theirs.
      report.failed[exp.name] = f"{type(e).__name__}: {e}"
      _log(f"FAILED {exp.name}: {report.failed[exp.name]}")
      path = os.path.join(directory, results_io.RESULTS_FILE)
    report.runs[exp.name] = results_io.read_points(path)
  return report


def tables(report: Report) -> str:
  """tables.md: every section of `report`."""
  env = report.environment
  lines = [f"# Device check: {env['device_kind']} ({env['backend']}), jax {env['jax']} / "
           f"jaxlib {env['jaxlib']}, {env['date']}", "", f"Command: `{env['command']}`.", "",
           "## jax#40101: seconds per small write, small vs large buffer", "",
           "| backend | write | update bytes | small us | large us | ratio | verdict |",
           "|---|---|---|---|---|---|---|"]
  lines += [f"| {w.backend} | {w.write} | {w.update_bytes} | {1e6 * w.seconds_per_write[0]:.3f} "
            f"| {1e6 * w.seconds_per_write[1]:.3f} | {w.ratio:.2f} | {w.verdict} |"
            for w in report.writes]
  if report.cache:
    c = report.cache
    lines += ["", f"Cache length {c.cache_lengths[0]} -> {c.cache_lengths[1]} ({c.run}, batch "
              f"{c.batch_size}): T_step {c.ratio:.2f}X, bytes read {c.bytes_ratio:.2f}X: "
              f"{c.verdict}."]
  steps = [next(r for r in rows if r.batch_size == b)
           for rows in report.runs.values() for b in sorted({r.batch_size for r in rows})]
  ks = sorted({k for r in steps for k in r.verify_ratio if k > 1})
  lines += ["", "## The target: T_step and T_verify(k) / T_step", "",
            "| run | batch | T_step ms | " + " | ".join(f"k={k}" for k in ks) + " |",
            "|---|---|---|" + "---|" * len(ks)]
  lines += [f"| {r.experiment} | {r.batch_size} | {1e3 * r.t_target_step_s:.3f} | "
            + " | ".join(f"{r.verify_ratio[k]:.2f}" if k in r.verify_ratio else "-" for k in ks)
            + " |" for r in steps]
  for name, rows in report.runs.items():
    lines += ["", f"## {name}: baseline vs speculative", ""]
    if rows:
      identical = [r.greedy_identical for r in rows if r.greedy_identical is not None]
      lines += [runner.summary_table(rows, []), "",
                f"Greedy tokens equal to the baseline's at {sum(identical)} of "
                f"{len(identical)} greedy points."]
    left = report.planned.get(name, 0) - len(rows)
    if left:
      lines.append(f"{left} of {report.planned[name]} points not measured (time budget or a "
                   "failure): rerun into the same folder to measure them.")
    if name in report.failed:
      lines.append(f"Failed: {report.failed[name]}")
  return "\n".join(lines) + "\n"


def run_regime_map(output_dir: str, map_settings: sweep.MapSettings = REGIME_MAP) -> str:
  """The regime map's sweep into `<output_dir>/regime_map`: rows, predictions, tables, and the
  figure where matplotlib is installed; returns the tables' text."""
  out = os.path.join(output_dir, REGIME_MAP_DIR)
  rows = sweep.run(map_settings, out)
  report = regime_predictions.write_report(rows, map_settings, regime_predictions.MapPredictions(),
                                           out, " ".join(sys.argv))
  try:
    from specdec_jax.regime_map import regime_figure  # noqa: PLC0415  (needs matplotlib)
  except ImportError:
    print(f"No matplotlib here: draw the figure with python -m experiments.regime_map "
          f"--nomeasure --output_dir={out}", file=sys.stderr)
  else:
    regime_figure.fig_regime_map(report["predictions"], report["family_errors"],
                                 report["last_level_cache"], os.path.join(out, "regime_map.png"))
  with open(os.path.join(out, regime_predictions.TABLES_FILE), encoding="utf-8") as f:
    return f.read()


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """The flags, and the `--gin.X=V` bindings among them."""
  rest, bindings = gin_flags.split_gin_args(list(argv))
  parser = argparse.ArgumentParser(prog="python -m experiments.device_check",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--output_dir", required=True,
                      help=f"Where {CHECKS_FILE}, {TABLES_FILE} and each run's folder go.")
  parser.add_argument("--gin_file", action="append", default=None,
                      help=f"Gin files of what is measured (default {DEFAULT_GIN}); "
                           "--gin.X=V binds one more value.")
  parser.add_argument("--regime_map", action="store_true",
                      help="Instead, the T5 regime map's sweep (REGIME_MAP's settings, our "
                           "family from the first run's Experiment.models_dir) into "
                           f"OUTPUT_DIR/{REGIME_MAP_DIR}.")
  return parser.parse_args(rest), bindings


def main(argv: Sequence[str]) -> None:
  args, bindings = parse_args(argv)
  os.environ[contention.GUARD_ENV] = "off"  # Recorded in every row, not enforced.
  gin_flags.parse_gin(args.gin_file or [DEFAULT_GIN], bindings)
  try:
    check = DeviceCheck()
    exps = experiments(check)
    if args.regime_map:
      print(run_regime_map(args.output_dir,
                           dataclasses.replace(REGIME_MAP, models_dir=exps[0].models_dir)))
      return
    check_models(exps)
    placement = gin_flags.placement()
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"python -m experiments.device_check: {e}")
  report = measure(check, exps, args.output_dir, " ".join(["python -m experiments.device_check",
                                                           *argv]), placement)
  text = tables(report)
  atomic_io.atomic_write_text(os.path.join(args.output_dir, TABLES_FILE), text)
  print(text)


if __name__ == "__main__":
  main(sys.argv[1:])
