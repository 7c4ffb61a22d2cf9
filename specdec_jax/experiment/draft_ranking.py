"""Trained drafts ranked by the speedup the whole cost model predicts from their alpha and c.

Alpha alone does not choose a draft: a wider or deeper one agrees more and costs more per
proposed token. For each training run (`experiment.train` with `train.alpha_every_steps`)
`rank_drafts` takes the held-out En-De alpha of its best entry (`alpha_curve.json`:
validation inputs, gamma 3, at the curve's temperatures) and that entry's parameters
(`<run>/best`, kept beside the curve, so a run still training can be ranked), then
calibrates the whole cost model on other validation inputs, batch 1
(`auto_gamma.calibrate` with that alpha: the draft's seconds per token, so its c, both
loops' own work and both encoders; the target's T_verify(k) timed once for all drafts),
and records gamma* and the predicted speedup. Timings run inside the guard
(`contention.quiet`: our registered jobs paused). `experiments.draft_speedups` is its
command.
"""

from __future__ import annotations

import datetime
import os

import jax
import numpy as np
import sentencepiece as spm

from specdec_jax import auto_gamma, benchmarking
from specdec_jax.checkpoints import load_hf_checkpoint, load_model
from specdec_jax.decoding import buckets
from specdec_jax.decoding.drafts import make_draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import T5Scorer
from specdec_jax.experiment import alpha_tracking, prompts
from specdec_jax.models import T5Model

TASK = "ende"
INPUT_LEN = 128


def best_alpha(model_dir: str) -> tuple[dict, dict[float, float]]:
  """(the run's recipe with its best entry's step, wall time and passes,
  {temperature: En-De alpha} of that entry)."""
  curve = alpha_tracking.read_curve(model_dir)
  best = next(e for e in curve["entries"] if e["step"] == curve["best"]["step"])
  return ({**curve["recipe"], "step": best["step"], "wall_time_s": best["wall_time_s"],
           "passes": best.get("passes")},
          {t: best["alpha"][TASK][f"T={t:g}"] for t in curve["settings"]["temperatures"]})


def calibration_inputs(model_dirs: list[str], examples: int) -> np.ndarray:
  """`examples` validation inputs evenly spaced through those the runs' alpha was not
  measured on, int32 `[examples, INPUT_LEN]`."""
  measured = {alpha_tracking.read_curve(d)["settings"]["examples"][TASK] for d in model_dirs}
  pairs = prompts.load_examples(TASK, alpha_tracking.SPLIT, None)[0]
  used = set().union(*(alpha_tracking.evenly_spaced(n, len(pairs)).tolist() for n in measured))
  rest = [i for i in range(len(pairs)) if i not in used]
  picked = [pairs[rest[i]][0] for i in alpha_tracking.evenly_spaced(examples, len(rest))]
  return prompts.tokenize(spm.SentencePieceProcessor(model_file=prompts.VOCAB_PATH), picked,
                          INPUT_LEN)


def rank_drafts(model_dirs: list[str], *, target_dir: str, examples: int = 8,
                max_decode_len: int = 64, max_gamma: int = 8) -> dict:
  """Calibrates every run's draft at each temperature of its curve.

  Args:
    model_dirs: training runs with an alpha curve.
    target_dir: the target (HF T5) the runs measured alpha against.
    examples: validation inputs the cost model is calibrated on (batch 1).
    max_decode_len: the most tokens per output.
    max_gamma: gamma candidates are 1..max_gamma.

  Returns:
    The JSON record: per run, its recipe and, per temperature, alpha, c, gamma*, the
    cost model's and Theorem 3.8's speedups at gamma* and the whole `GammaChoice`.

  Raises:
    FileNotFoundError: a run has no alpha curve, or the corpora are not prepared.
  """
  target_cfg, target_params = load_hf_checkpoint(target_dir, dropout_rate=0.0)
  target_model = T5Model(target_cfg)
  target = T5Scorer(target_model, target_model.prepare(jax.device_put(target_params)))
  batches = [buckets.to_bucket(x[None]) for x in calibration_inputs(model_dirs, examples)]
  verify = auto_gamma.verify_times(target, batches[0], max_gamma=max_gamma,
                                   max_decode_len=max_decode_len, calls=8, repeats=3)
  runs = {}
  for model_dir in model_dirs:
    recipe, alphas = best_alpha(model_dir)
    model, params = load_model(os.path.join(model_dir, alpha_tracking.BEST_DIR),
                               dropout_rate=0.0)
    draft = make_draft(model, jax.device_put(params))
    by_t = {}
    for t, alpha in alphas.items():
      choice = auto_gamma.calibrate(
          target, draft, batches, warp=Warp(temperature=t), max_decode_len=max_decode_len,
          max_gamma=max_gamma, eos_id=target_cfg.eos_token_id, rng=jax.random.PRNGKey(0),
          verify=verify, alpha=alpha,
          calibration_gamma=min(auto_gamma.DEFAULT_CALIBRATION_GAMMA, max_gamma))
      by_t[f"T={t:g}"] = {"alpha": alpha, "c": choice.c, "gamma": choice.gamma,
                          "speedup_cost_model": choice.speedup_cost_model[choice.gamma],
                          "speedup_thm38": choice.speedup_thm38[choice.gamma],
                          "choice": choice.to_json()}
    runs[recipe["name"]] = {
        "model_dir": model_dir, "recipe": recipe,
        "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
        "by_temperature": by_t,
        "mean_speedup_cost_model": float(np.mean([v["speedup_cost_model"]
                                                  for v in by_t.values()]))}
  return {
      "what": "trained drafts ranked by the whole cost model's predicted speedup at gamma*, "
              "from held-out alpha (the run's best curve entry) and measured c",
      "command": "python -m experiments.draft_speedups", "target": target_dir,
      "task": TASK, "calibration_examples": examples, "batch_size": 1,
      "max_decode_len": max_decode_len,
      "verify_ratio": {str(k): t / verify.t_step for k, t in verify.t_chunk.items()},
      "t_step_s": verify.t_step, "verify_idle_check": dict(verify.idle_check),
      "runs": runs, "environment": benchmarking.environment(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
