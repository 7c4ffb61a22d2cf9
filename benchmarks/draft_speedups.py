"""Trained drafts ranked by the speedup the whole cost model predicts from their alpha and c.

  python -m benchmarks draft_speedups --model_dirs=checkpoints/shapes/d128_l1,... \
      [--examples=8] [--output=results/alpha/draft_speedups.json]

`specdec_jax.draft_pricing.t5_runs.rank_runs` over the drafts (training runs' held-out
alpha from their curves, an exported draft's such as assets/models/draft_shared_enc_signals
measured alike; their c timed in turn; the cost model; the guard on). Writes one JSON
(atomically; runs already in it and not named now are kept) and prints the ranking, by the
speedup the model calls predict (alpha, c, T_verify(k)), with the whole cost model's beside it, and
draws alpha against c over that speedup's contours (the JSON's path with `.png`).
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from specdec_jax import atomic_io
from specdec_jax.draft_pricing import t5_runs
from specdec_jax.experiment import figures

_MODEL_DIRS = flags.DEFINE_list("model_dirs", None, "Training runs or exported drafts, "
                                "comma-separated.")
_TARGET = flags.DEFINE_string("target", "assets/models/target", "The target the runs measured "
                              "alpha against.")
_EXAMPLES = flags.DEFINE_integer("examples", 8, "Validation inputs the cost model is "
                                 "calibrated on (batch 1).", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "results/alpha/draft_speedups.json", "The JSON written.")
flags.mark_flag_as_required("model_dirs")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  try:
    record = t5_runs.rank_runs(_MODEL_DIRS.value, target_dir=_TARGET.value,
                               examples=_EXAMPLES.value)
  except FileNotFoundError as e:
    raise app.UsageError(str(e)) from e
  if os.path.exists(_OUTPUT.value):
    with open(_OUTPUT.value, encoding="utf-8") as f:
      record["runs"] = {**json.load(f)["runs"], **record["runs"]}
  atomic_io.write_json(_OUTPUT.value, record)
  figure = figures.fig_draft_tradeoff(record, os.path.splitext(_OUTPUT.value)[0] + ".png")
  ranked = sorted(record["runs"].items(), key=lambda kv: -kv[1]["mean_speedup_steps_only"])
  for name, run in ranked:
    row = " | ".join(
        f"{t}: alpha {v['alpha']:.3f} c {v['c']:.3f} model calls {v['speedup_steps_only']:.2f}X"
        f" (gamma {v['gamma_steps_only']}), whole {v['speedup_cost_model']:.2f}X (gamma "
        f"{v['gamma']})" for t, v in run["by_temperature"].items())
    print(f"{name:32s} {run['params'] / 1e6:.2f}M  {row}")
  print(f"Wrote {_OUTPUT.value} and {figure}.")
