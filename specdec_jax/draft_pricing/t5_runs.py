"""The T5 family's trained drafts, ranked (`draft_ranking.rank_drafts`) from their training runs.

For each training run (`training.train_t5` with `TrainConfig.alpha_every_steps`)
`rank_runs` takes the held-out En-De alpha of its best entry (`alpha_curve.json`:
validation inputs, gamma 3, at the curve's temperatures) and that entry's parameters
(`<run>/best`, kept beside the curve, so a run still training can be ranked); for an
exported draft (a model directory with no curve, such as a shipped one) it measures that
alpha now, the way the runs' curves did. Every draft is priced with its weights rounded
to float16, as the shipped family stores them, on other validation inputs, batch 1.
`python -m benchmarks draft_speedups` is its command.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import sentencepiece as spm

from specdec_jax.data import prompts
from specdec_jax.decoding import buckets
from specdec_jax.draft_pricing.draft_ranking import DraftToRank, rank_drafts
from specdec_jax.models.t5 import T5Model, T5Scorer, make_draft
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_model, rounded_to_half
from specdec_jax.training import alpha_tracking

TASK = "ende"
INPUT_LEN = 128


# How an exported draft's alpha is measured when no training run is ranked beside it:
# training.train_t5's alpha settings under the drafts' gin files.
DEFAULT_ALPHA_SETTINGS = {"examples": {TASK: 128}, "input_len": INPUT_LEN,
                          "temperatures": [0.0, 1.0], "gamma": 3, "max_decode_len": 64,
                          "batch_size": 32, "seed": 0}


def is_run(model_dir: str) -> bool:
  """Whether `model_dir` is a training run with an alpha curve (else an exported draft)."""
  return os.path.exists(os.path.join(model_dir, alpha_tracking.CURVE_FILE))


def alpha_settings(model_dirs: list[str]) -> dict:
  """How alpha is measured for exported drafts: the first run's curve's settings, or
  `DEFAULT_ALPHA_SETTINGS` when no run is among `model_dirs`."""
  runs = [d for d in model_dirs if is_run(d)]
  return alpha_tracking.read_curve(runs[0])["settings"] if runs else DEFAULT_ALPHA_SETTINGS


def exported_alpha(draft_dir: str, probe: alpha_tracking.AlphaProbe
                   ) -> tuple[dict, dict[float, float]]:
  """(its recipe: name, directory and how alpha was measured, {temperature: En-De alpha}
  measured now by `probe`, rounded as a curve rounds it) of an exported draft.

  Raises:
    FileNotFoundError: `draft_dir` is neither a training run nor a model directory.
  """
  if not os.path.exists(os.path.join(draft_dir, "config.json")):
    raise FileNotFoundError(f"{draft_dir} is neither a training run (no "
                            f"{alpha_tracking.CURVE_FILE}) nor an exported draft (no "
                            "config.json): pass a run's directory or a draft's.")
  model, params = load_model(draft_dir, dropout_rate=0.0)
  measured = probe.measure(model, jax.device_put(params))[TASK]
  return ({"name": os.path.basename(os.path.normpath(draft_dir)), "draft_dir": draft_dir,
           "alpha_settings": probe.settings()},
          {t: round(measured[alpha_tracking.temperature_key(t)].beta, 4)
           for t in probe.temperatures})


def best_alpha(model_dir: str) -> tuple[dict, dict[float, float]]:
  """(the run's recipe with its best entry's step, wall time and passes,
  {temperature: En-De alpha} of that entry)."""
  curve = alpha_tracking.read_curve(model_dir)
  best = next(e for e in curve["entries"] if e["step"] == curve["best"]["step"])
  return ({**curve["recipe"], "step": best["step"], "wall_time_s": best["wall_time_s"],
           "passes": best.get("passes")},
          {t: best["alpha"][TASK][f"T={t:g}"] for t in curve["settings"]["temperatures"]})


def calibration_inputs(model_dirs: list[str], examples: int) -> np.ndarray:
  """`examples` validation inputs evenly spaced through those the drafts' alpha was not
  measured on, int32 `[examples, INPUT_LEN]`."""
  exported = alpha_settings(model_dirs)["examples"][TASK]
  measured = {alpha_tracking.read_curve(d)["settings"]["examples"][TASK] if is_run(d)
              else exported for d in model_dirs}
  pairs = prompts.load_examples(TASK, alpha_tracking.SPLIT, None)[0]
  used = set().union(*(alpha_tracking.evenly_spaced(n, len(pairs)).tolist() for n in measured))
  rest = [i for i in range(len(pairs)) if i not in used]
  picked = [pairs[rest[i]][0] for i in alpha_tracking.evenly_spaced(examples, len(rest))]
  return prompts.tokenize(spm.SentencePieceProcessor(model_file=prompts.VOCAB_PATH), picked,
                          INPUT_LEN)


def drafts_to_rank(model_dirs: list[str], target_model: T5Model, target_params: dict
                   ) -> list[DraftToRank]:
  """Each run's best draft with its curve's alpha, or each exported draft with its alpha
  measured now (with `alpha_settings(model_dirs)`, against the target), weights rounded to
  float16.

  Raises:
    FileNotFoundError: a directory is neither a run nor a draft.
  """
  probe = None
  drafts = []
  for model_dir in model_dirs:
    if is_run(model_dir):
      recipe, alphas = best_alpha(model_dir)
      params_dir = os.path.join(model_dir, alpha_tracking.BEST_DIR)
    else:
      probe = probe or _probe(target_model, target_params, alpha_settings(model_dirs))
      recipe, alphas = exported_alpha(model_dir, probe)
      params_dir = model_dir
    model, params = load_model(params_dir, dropout_rate=0.0)
    drafts.append(DraftToRank(
        name=recipe["name"], draft=make_draft(model, jax.device_put(rounded_to_half(params))),
        alphas=alphas, params=int(sum(np.size(x) for x in jax.tree.leaves(params))),
        model_dir=model_dir, recipe=recipe))
  return drafts


def rank_runs(model_dirs: list[str], *, target_dir: str, examples: int = 8,
              max_decode_len: int = 64, max_gamma: int = 8, timing_calls: int = 32,
              timing_repeats: int = 5) -> dict:
  """Prices every run's draft at each temperature of its curve (`rank_drafts`).

  Args:
    model_dirs: training runs with an alpha curve, or exported drafts (their alpha is
      measured first, with `alpha_settings(model_dirs)`, outside the guard).
    target_dir: the target (HF T5) the runs measured alpha against.
    examples: validation inputs the cost model is calibrated on (batch 1).
    max_decode_len, max_gamma, timing_calls, timing_repeats: as `rank_drafts`.

  Returns:
    The JSON record (`draft_ranking.Ranking.to_json`, with what was ranked, the command,
    the target and the task): per run (a later draft of the same name replaces an
    earlier one), its recipe and, per temperature, alpha, c, gamma* and the whole cost
    model's and Theorem 3.8's speedups there, the best speedup of the model calls alone
    (`speedup_steps_only`, what drafts are ranked by, `mean_speedup_steps_only` over
    temperatures) and the `GammaChoice`.

  Raises:
    FileNotFoundError: a directory is neither a run nor a draft, or the corpora are not
      prepared.
  """
  target_cfg, target_params = load_hf_checkpoint(target_dir, dropout_rate=0.0)
  target_model = T5Model(target_cfg)
  target = T5Scorer(target_model, target_model.prepare(jax.device_put(target_params)))
  batches = [buckets.to_bucket(x[None]) for x in calibration_inputs(model_dirs, examples)]
  # One draft per name: a later one replaces an earlier, as the record's runs are keyed.
  drafts = list({d.name: d for d in drafts_to_rank(model_dirs, target_model,
                                                   target_params)}.values())
  ranking = rank_drafts(target, drafts, batches, eos_id=target_cfg.eos_token_id,
                        max_decode_len=max_decode_len, max_gamma=max_gamma,
                        timing_calls=timing_calls, timing_repeats=timing_repeats)
  return {
      "what": "trained drafts ranked by the model calls' predicted speedup (alpha, c, "
              "T_verify(k)), the whole cost model's beside it, from held-out alpha (a run's "
              "best curve entry, an exported draft's measured alike) and c timed in turn",
      "command": "python -m benchmarks draft_speedups", "target": target_dir,
      "task": TASK, **ranking.to_json()}


def _probe(target_model: T5Model, target_params: dict, settings: dict
           ) -> alpha_tracking.AlphaProbe:
  """The En-De alpha probe that `settings` (a curve's, or the defaults) describe."""
  inputs = alpha_tracking.held_out_inputs([TASK], settings["examples"][TASK],
                                          settings["input_len"])
  return alpha_tracking.AlphaProbe(
      target_model, jax.device_put(target_params), inputs, tuple(settings["temperatures"]),
      settings["gamma"], settings["max_decode_len"], settings["batch_size"], settings["seed"])
