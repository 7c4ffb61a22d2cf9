"""Acceptance rates of the shipped drafts against the target on a whole split (test by default).

  python -m experiments.measure_alpha [--num_examples=N] [--split=test] [--gin.Settings.gamma=3]

For each draft, task and temperature this runs speculative sampling (no timing,
no baseline) over the examples of the task's `--split` in batches and pools the loop's
counters: alpha as the mean of beta = sum_x min(p(x), q(x)) over verified
positions (the paper's definition, section 3.1) and as the empirical S / (S + R),
plus tokens per target call (`specdec_jax.stats`). The shared settings (models
directory, target, input and output lengths, gamma, seed) are `Settings`, bound
in gin (`--gin_file`, `--gin.Settings.FIELD=VALUE`). The JSON it writes (atomically) is what
`experiments.export_family --alpha_json` puts in the model cards:
`{"<draft>": {"<task>": {"T=0": alpha, "T=1": alpha}}, "_details": {"<draft>": {...}}}`,
with how each draft was measured (examples, gamma, lengths, environment, date)
under `_details`. Drafts already in the file and not named by `--drafts` are
kept, so the family can be measured one draft at a time.
"""

from __future__ import annotations

import datetime
import json
import math
import os

import jax
import numpy as np
import sentencepiece as spm
import tqdm
from absl import app, flags

from specdec_jax import atomic_io, benchmarking
from specdec_jax.checkpoints import (
  load_hf_checkpoint,
  load_hf_config,
  load_model,
  load_model_config,
)
from specdec_jax.data import layout, prompts
from specdec_jax.decoding.sampling import Warp
from specdec_jax.harness import family, gin_flags, settings
from specdec_jax.models.t5 import T5Model, make_draft, measure_alpha

_DRAFTS = flags.DEFINE_list("drafts", list(family.DRAFTS), "The drafts' sub-folders.")
_TASKS = flags.DEFINE_list("tasks", ["ende", "mansum"], "Tasks.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
_SPLIT = flags.DEFINE_enum(
    "split", "test", ["train", "validation", "test"],
    "The split the inputs come from: test for the reported alpha; train or validation to "
    "see how much of it a draft owes to having seen the inputs.")
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples", None, "Examples per task at most, evenly spaced through the split "
    "(default: the whole split).", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Rows decoded together.", lower_bound=1)
_OUTPUT = flags.DEFINE_string(
    "output", os.path.join(layout.REPO_ROOT, "results", "alpha", "alpha.json"),
    "The JSON written; drafts already in it and not measured now are kept.")

DETAILS = "_details"  # Key of the per-draft measurement settings in the JSON.


def _are_temperatures(values: list[str]) -> bool:
  try:
    return bool(values) and all(math.isfinite(float(t)) and float(t) >= 0 for t in values)
  except ValueError:
    return False


flags.register_validator("temperatures", _are_temperatures,
                         "--temperatures must be numbers >= 0 (0 = greedy), e.g. 0,1.")
flags.register_validator("tasks", lambda tasks: bool(tasks) and set(tasks) <= set(layout.CORPORA),
                         f"--tasks must list some of {sorted(layout.CORPORA)}.")
flags.register_validator("drafts", bool, "--drafts must name at least one draft.")


def spread(items: list, count: int | None) -> list:
  """`count` items evenly spaced through `items` (all of them if None or more)."""
  if count is not None and count < 1:
    raise app.UsageError(f"--num_examples={count}: use a count >= 1, or leave it unset.")
  if count is None or count >= len(items):
    return items
  return [items[i] for i in np.linspace(0, len(items) - 1, count).round().astype(int)]


def _batches(tokens: np.ndarray, batch_size: int) -> list[np.ndarray]:
  """Rows cut into batches of `batch_size`; the last one holds the rest.

  Padding it with filler rows would add them to the pooled counters, so it is
  left short (one more compilation).
  """
  return [tokens[i:i + batch_size] for i in range(0, len(tokens), batch_size)]


def merge_alphas(old: dict, new: dict) -> dict:
  """`new`'s drafts replace (or join) those of `old`; both in the file's layout."""
  merged = {k: v for k, v in old.items() if k != DETAILS and k not in new}
  merged.update({k: v for k, v in new.items() if k != DETAILS})
  details = {k: v for k, v in old.get(DETAILS, {}).items() if k in merged}
  details.update(new.get(DETAILS, {}))
  return {**dict(sorted(merged.items())), DETAILS: dict(sorted(details.items()))}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  shared = settings.load_settings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  temperatures = [float(t) for t in _TEMPERATURES.value]
  # Every config is checked before any weights load.
  target_vocab = load_hf_config(shared.checkpoint_dir(shared.target)).vocab_size
  for name in _DRAFTS.value:
    vocab = load_model_config(shared.checkpoint_dir(name)).vocab_size
    if vocab != target_vocab:
      raise app.UsageError(f"--drafts: {name} has vocab_size {vocab}, the target "
                           f"{target_vocab}; a draft must share the target's vocabulary.")
  target_cfg, target_params = load_hf_checkpoint(shared.checkpoint_dir(shared.target))
  target = T5Model(target_cfg)
  target_params = target.prepare(jax.device_put(target_params))  # Once, for every run.
  processor = spm.SentencePieceProcessor(
      model_file=os.path.join(shared.checkpoint_dir(shared.target), "spiece.model"))
  examples, split_sizes = {}, {}
  for task in _TASKS.value:
    pairs = prompts.load_examples(task, _SPLIT.value, None)[0]
    split_sizes[task] = len(pairs)
    pairs = spread(pairs, _NUM_EXAMPLES.value)
    examples[task] = _batches(prompts.tokenize(processor, [x for x, _ in pairs],
                                               shared.input_len), _BATCH_SIZE.value)
  alphas, by_run = {}, {}
  jobs = [(d, t, temp) for d in _DRAFTS.value for t in _TASKS.value for temp in temperatures]
  drafts = {}
  for name, task, temperature in tqdm.tqdm(jobs, unit="run"):
    if name not in drafts:
      drafts[name] = make_draft(*load_model(shared.checkpoint_dir(name)))
    got = measure_alpha(target, target_params, drafts[name], examples[task],
                                   gamma=shared.gamma, max_decode_len=shared.max_decode_len,
                                   warp=Warp(temperature), rng=jax.random.PRNGKey(shared.seed))
    key = f"T={temperature:g}"
    alphas.setdefault(name, {}).setdefault(task, {})[key] = round(got.beta, 4)
    by_run.setdefault(name, {}).setdefault(task, {})[key] = got._asdict()
    tqdm.tqdm.write(f"{name} {task} {key}: alpha {got.beta:.3f} (S/(S+R) "
                    f"{got.empirical:.3f}), {got.tokens_per_iteration:.2f} tokens/call")
  how = {
      "estimator": "mean beta over verified positions (paper, section 3.1)",
      "gamma": shared.gamma, "batch_size": _BATCH_SIZE.value, "seed": shared.seed,
      "split": _SPLIT.value,
      "examples": {t: int(sum(len(b) for b in examples[t])) for t in examples},
      "split_examples": split_sizes,
      "input_len": shared.input_len, "max_decode_len": shared.max_decode_len,
      "models_dir": os.path.relpath(shared.models_dir, layout.REPO_ROOT),
      "environment": benchmarking.environment(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  }
  alphas[DETAILS] = {name: {**how, "by_run": by_run[name]} for name in by_run}
  if os.path.exists(_OUTPUT.value):
    with open(_OUTPUT.value) as f:
      alphas = merge_alphas(json.load(f), alphas)
  atomic_io.write_json(_OUTPUT.value, alphas)
  print(f"Wrote {_OUTPUT.value}.")


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
