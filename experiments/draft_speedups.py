"""Trained drafts ranked by the speedup the whole cost model predicts from their alpha and c.

  python -m experiments.draft_speedups --model_dirs=checkpoints/shapes/d128_l1,... \
      [--examples=8] [--output=results/alpha/draft_speedups.json]

Alpha alone does not choose a draft: a wider or deeper one agrees more and costs more per
proposed token. For each training run (`python -m experiments.train` with
`train.alpha_every_steps`) this takes the held-out En-De alpha of its best entry
(`alpha_curve.json`: validation inputs, gamma 3, at T = 0 and T = 1) and that entry's
parameters (`<run>/best`, kept beside the curve, so a run still training can be ranked),
then calibrates the whole cost model on `--examples` other validation inputs, batch 1
(`auto_gamma.calibrate` with that alpha: the draft's seconds per token, so its c, both
loops' own work and both encoders; the target's T_verify(k) timed once for all drafts),
and records gamma* and the predicted speedup. Timings run inside the guard
(`contention.quiet`: our registered jobs paused). Writes one JSON (atomically; runs
already in it and not named now are kept) and prints the ranking.
"""

from __future__ import annotations

import datetime
import json
import os

import jax
import numpy as np
import sentencepiece as spm
from absl import app, flags

from specdec_jax import atomic_io, auto_gamma, benchmarking
from specdec_jax.checkpoints import load_hf_checkpoint, load_model
from specdec_jax.decoding import buckets
from specdec_jax.decoding.drafts import make_draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import T5Scorer
from specdec_jax.experiment import alpha_tracking, prompts
from specdec_jax.models import T5Model

_MODEL_DIRS = flags.DEFINE_list("model_dirs", None, "Training runs, comma-separated.")
_TARGET = flags.DEFINE_string("target", "assets/models/target", "The target the runs measured "
                              "alpha against.")
_EXAMPLES = flags.DEFINE_integer("examples", 8, "Validation inputs the cost model is "
                                 "calibrated on (batch 1).", lower_bound=1)
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64, "Most tokens per output.",
                                       lower_bound=1)
_MAX_GAMMA = flags.DEFINE_integer("max_gamma", 8, "gamma candidates 1..max_gamma.",
                                  lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "results/alpha/draft_speedups.json", "The JSON written.")
flags.mark_flag_as_required("model_dirs")

TASK = "ende"


def _best_alpha(model_dir: str) -> tuple[dict, dict[float, float]]:
  """(the run's recipe, {temperature: En-De alpha} of its best curve entry)."""
  curve = alpha_tracking.read_curve(model_dir)
  best = next(e for e in curve["entries"] if e["step"] == curve["best"]["step"])
  return ({**curve["recipe"], "step": best["step"], "wall_time_s": best["wall_time_s"],
           "passes": best.get("passes")},
          {t: best["alpha"][TASK][f"T={t:g}"] for t in curve["settings"]["temperatures"]})


def _calibration_inputs(model_dirs: list[str]) -> np.ndarray:
  """`--examples` validation inputs evenly spaced through those the runs' alpha was not
  measured on, int32 `[examples, 128]`."""
  measured = {alpha_tracking.read_curve(d)["settings"]["examples"][TASK] for d in model_dirs}
  pairs = prompts.load_examples(TASK, alpha_tracking.SPLIT, None)[0]
  used = set().union(*(alpha_tracking.evenly_spaced(n, len(pairs)).tolist() for n in measured))
  rest = [i for i in range(len(pairs)) if i not in used]
  picked = [pairs[rest[i]][0] for i in alpha_tracking.evenly_spaced(_EXAMPLES.value, len(rest))]
  return prompts.tokenize(spm.SentencePieceProcessor(model_file=prompts.VOCAB_PATH), picked, 128)


def measure() -> dict:
  """Calibrates every run's draft at both temperatures; returns the JSON record."""
  target_cfg, target_params = load_hf_checkpoint(_TARGET.value, dropout_rate=0.0)
  target_model = T5Model(target_cfg)
  target = T5Scorer(target_model, target_model.prepare(jax.device_put(target_params)))
  batches = [buckets.to_bucket(x[None]) for x in _calibration_inputs(_MODEL_DIRS.value)]
  verify = auto_gamma.verify_times(target, batches[0], max_gamma=_MAX_GAMMA.value,
                                   max_decode_len=_MAX_DECODE_LEN.value, calls=8, repeats=3)
  runs = {}
  for model_dir in _MODEL_DIRS.value:
    recipe, alphas = _best_alpha(model_dir)
    model, params = load_model(os.path.join(model_dir, alpha_tracking.BEST_DIR),
                               dropout_rate=0.0)
    draft = make_draft(model, jax.device_put(params))
    by_t = {}
    for t, alpha in alphas.items():
      choice = auto_gamma.calibrate(
          target, draft, batches, warp=Warp(temperature=t), max_decode_len=_MAX_DECODE_LEN.value,
          max_gamma=_MAX_GAMMA.value, eos_id=target_cfg.eos_token_id, rng=jax.random.PRNGKey(0),
          verify=verify, alpha=alpha,
          calibration_gamma=min(auto_gamma.DEFAULT_CALIBRATION_GAMMA, _MAX_GAMMA.value))
      by_t[f"T={t:g}"] = {"alpha": alpha, "c": choice.c, "gamma": choice.gamma,
                          "speedup_cost_model": choice.speedup_cost_model[choice.gamma],
                          "speedup_thm38": choice.speedup_thm38[choice.gamma],
                          "choice": choice.to_json()}
      print(f"{recipe['name']} T={t:g}: alpha {alpha:.3f} c {choice.c:.3f} gamma "
            f"{choice.gamma}: cost model {choice.speedup_cost_model[choice.gamma]:.2f}X "
            f"(Thm 3.8 {choice.speedup_thm38[choice.gamma]:.2f}X)", flush=True)
    runs[recipe["name"]] = {
        "model_dir": model_dir, "recipe": recipe,
        "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "by_temperature": by_t,
        "mean_speedup_cost_model": float(np.mean([v["speedup_cost_model"]
                                                  for v in by_t.values()]))}
  return {
      "what": "trained drafts ranked by the whole cost model's predicted speedup at gamma*, "
              "from held-out alpha (the run's best curve entry) and measured c",
      "command": "python -m experiments.draft_speedups", "target": _TARGET.value,
      "task": TASK, "calibration_examples": _EXAMPLES.value, "batch_size": 1,
      "max_decode_len": _MAX_DECODE_LEN.value,
      "verify_ratio": {str(k): t / verify.t_step for k, t in verify.t_chunk.items()},
      "t_step_s": verify.t_step, "verify_idle_check": dict(verify.idle_check),
      "runs": runs, "environment": benchmarking.environment(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  try:
    record = measure()
  except FileNotFoundError as e:
    raise app.UsageError(str(e)) from e
  if os.path.exists(_OUTPUT.value):
    with open(_OUTPUT.value, encoding="utf-8") as f:
      record["runs"] = {**json.load(f)["runs"], **record["runs"]}
  atomic_io.write_json(_OUTPUT.value, record)
  ranked = sorted(record["runs"].items(), key=lambda kv: -kv[1]["mean_speedup_cost_model"])
  for name, run in ranked:
    row = " | ".join(f"{t}: alpha {v['alpha']:.3f} c {v['c']:.3f} gamma {v['gamma']} "
                     f"{v['speedup_cost_model']:.2f}X" for t, v in run["by_temperature"].items())
    print(f"{name:32s} {run['params'] / 1e6:.2f}M  {row}")
  print(f"Wrote {_OUTPUT.value}.")


if __name__ == "__main__":
  app.run(main)
