"""Acceptance rates of drafts against a target of any kind, on a whole split: Table 3.

  python -m experiments.measure_alpha [--gin_file=gin_configs/llama_smollm2.gin] \
      [--drafts=a,b] [--tasks=ende,mansum] [--temperatures=0,1] [--split=test] \
      [--num_examples=N] [--batch_size=32] [--output=results/alpha/alpha.json]

The target and its drafts are built as `experiments.run` builds them
(`experiment.targets.registry`): the shared `Settings`, bound in gin (`--gin_file`, any run's
config; `--gin.Settings.FIELD=VALUE`), name the kind of target (`Settings.target_kind`),
the target, the lengths, gamma and the seed; every `--drafts` spec is a draft of that kind
(for a "t5" target, by default, the shipped family's drafts). The run is checked before
any weights load. For each draft, task and temperature this runs the speculative loop (no
timing, no baseline) over the task's examples of `--split`, evenly spaced, in batches
(batch i samples with `fold_in(PRNGKey(seed), i)`; the last batch is left short, since
filler rows would join the counters), and pools its counters (`stats.Pooled`): alpha as
the mean of beta = sum_x min(p(x), q(x)) over verified positions (the paper's estimator,
section 3.1) and as S / (S + R), and tokens per target call. Nothing is timed, so
`XLA_FLAGS=--xla_backend_optimization_level=0` may cut a large target's compile time
without changing a number.

`--output` (JSON, rewritten atomically after every row):
`{"alpha": {draft: {task: {"T=0": {"alpha_beta", "alpha_empirical", "tokens_per_call",
"tokens", "iterations", "examples", "accepted_histogram"}}}}, "_details": {...}}`, with
how they were measured under `_details` (`details`). Rows of drafts not measured now are
kept, so the drafts can be measured one at a time; a file measured with other settings is
refused. `experiments.export_family --alpha_json` puts the alphas in the model cards, and
`experiments.analyze` prints a decoder-only target's file as Table 3's rows.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specdec_jax import atomic_io, distributed, stats, validation
from specdec_jax.costs import timing
from specdec_jax.data import chat_prompts, layout, prompts
from specdec_jax.decoding import buckets, speculative
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment import gin_flags, settings
from specdec_jax.experiment.targets import family, interface, registry

_DRAFTS = flags.DEFINE_list(
    "drafts", None, "Draft specs of the target's kind (`Experiment.drafts` of a run); default "
    "for a 't5' target: the shipped family's drafts.")
_TASKS = flags.DEFINE_list("tasks", ["ende", "mansum"], "Tasks.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
_SPLIT = flags.DEFINE_enum(
    "split", "test", list(layout.SPLITS),
    "The split the inputs come from: test for the reported alpha; train or validation to "
    "see how much of it a draft owes to having seen the inputs.")
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples", None, "Examples per task at most, evenly spaced through the split "
    "(default: the whole split).", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Rows decoded together.", lower_bound=1)
_OUTPUT = flags.DEFINE_string(
    "output", os.path.join(layout.REPO_ROOT, "results", "alpha", "alpha.json"),
    "The JSON written; rows of drafts not measured now are kept.")

DETAILS = "_details"  # Key of how the rows were measured.
ESTIMATORS = {"alpha_beta": "mean beta over verified positions (paper, section 3.1)",
              "alpha_empirical": "S / (S + R)"}


def _are_temperatures(values: list[str]) -> bool:
  try:
    return bool(values) and all(math.isfinite(float(t)) and float(t) >= 0 for t in values)
  except ValueError:
    return False


flags.register_validator("temperatures", _are_temperatures,
                         "--temperatures must be numbers >= 0 (0 = greedy), e.g. 0,1.")
flags.register_validator(
    "tasks", lambda tasks: bool(tasks) and set(tasks) <= {*layout.CORPORA, *chat_prompts.TASKS},
    f"--tasks must list some of {sorted({*layout.CORPORA, *chat_prompts.TASKS})}.")
flags.register_validator("drafts", lambda drafts: drafts is None or bool(drafts),
                         "--drafts must name at least one draft.")


def spread(items: list, count: int | None) -> list:
  """`count` items evenly spaced through `items` (all of them if None or more)."""
  if count is not None and count < 1:
    raise app.UsageError(f"--num_examples={count}: use a count >= 1, or leave it unset.")
  if count is None or count >= len(items):
    return items
  return [items[i] for i in np.linspace(0, len(items) - 1, count).round().astype(int)]


def batches(tokens: np.ndarray, batch_size: int) -> list[np.ndarray]:
  """Rows cut into batches of `batch_size`; the last one holds the rest.

  Padding it with filler rows would add them to the pooled counters, so it is
  left short (one more compilation).
  """
  return [tokens[i:i + batch_size] for i in range(0, len(tokens), batch_size)]


def temperature_key(temperature: float) -> str:
  """How a temperature keys a row: "T=0", "T=1", "T=0.5"."""
  return f"T={temperature:g}"


def measure(target: interface.LoadedTarget, draft: Draft, inputs: Sequence[jax.Array], *,
            gamma: int, max_decode_len: int, temperature: float, seed: int) -> dict[str, Any]:
  """One row: the speculative loop's counters pooled over `inputs`.

  Args:
    target: the loaded target.
    draft: the draft, checked against the target (`validation.check_draft`).
    inputs: int32 `[batch, input_len]` batches, checked against the vocabulary.
    gamma: proposals per target call.
    max_decode_len: the most tokens per row.
    temperature: the sampling temperature (0 = greedy).
    seed: batch i samples with `fold_in(PRNGKey(seed), i)`.

  Returns:
    alpha by both estimators, tokens per target call, and the counters they come from.
  """
  calls = []
  for i, batch in enumerate(inputs):
    out = speculative.speculative_decode(
        target.scorer, draft, batch, jax.random.fold_in(jax.random.PRNGKey(seed), i),
        gamma=gamma, max_decode_len=max_decode_len, warp=Warp(temperature),
        eos_id=target.eos_id, draft_inputs=batch)
    calls.append(distributed.fetch(out.stats))
  pooled = stats.Pooled.of(calls)
  return {"alpha_beta": pooled.alpha_beta(), "alpha_empirical": pooled.alpha_empirical(),
          "tokens_per_call": pooled.tokens_per_call(), "tokens": int(pooled["tokens"]),
          "iterations": int(pooled["iterations"]),
          "examples": sum(int(b.shape[0]) for b in inputs),
          "accepted_histogram": pooled["accepted_histogram"].astype(int).tolist()}


def run_settings(exp: settings.Experiment) -> dict[str, Any]:
  """What every row of a file depends on besides its draft, task and temperature."""
  return {"target_kind": exp.target_kind, "target": exp.target, "models_dir": exp.models_dir,
          "split": exp.split, "num_examples": _NUM_EXAMPLES.value,
          "batch_size": _BATCH_SIZE.value, "gamma": exp.gamma, "input_len": exp.input_len,
          "max_decode_len": exp.max_decode_len, "seed": exp.seed, "dtype": exp.dtype}


def details(exp: settings.Experiment, target: interface.LoadedTarget,
            examples: dict[str, tuple[int, int]], previous: dict[str, Any]) -> dict[str, Any]:
  """`_details`: how the rows were measured.

  Args:
    exp: the run's settings.
    target: the loaded target.
    examples: task -> (examples measured, examples in the split).
    previous: the `_details` of the file being extended ({} for a new file).
  """
  kind = registry.target_kind(exp.target_kind)
  drafts = {**previous.get("drafts", {}),
            **{spec: kind.draft_kind(spec).name for spec in exp.drafts}}
  return {
      "target": f"{exp.target} ({exp.target_kind}, {exp.dtype})", "settings": run_settings(exp),
      "prompts": {**previous.get("prompts", {}),
                  **{task: target.prompt_format(task) for task in exp.tasks}},
      "examples": {**previous.get("examples", {}), **{t: n for t, (n, _) in examples.items()}},
      "split_examples": {**previous.get("split_examples", {}),
                         **{t: total for t, (_, total) in examples.items()}},
      "drafts": drafts,
      "ngram_fit": target.ngram_fit[0] if target.ngram_fit else previous.get("ngram_fit"),
      "ngram_fit_tokens": (target.ngram_fit[1] if target.ngram_fit
                           else previous.get("ngram_fit_tokens")),
      "estimators": ESTIMATORS,
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "environment": timing.environment(target.scorer.decode_options.provenance())}


def previous_rows(path: str, exp: settings.Experiment) -> dict[str, Any]:
  """The file at `path` to extend ({} if there is none).

  Raises:
    app.UsageError: it was measured with other settings (its rows cannot join these).
  """
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    previous = json.load(f)
  theirs, ours = previous.get(DETAILS, {}).get("settings"), run_settings(exp)
  if theirs != ours:
    differ = sorted(k for k in {*ours, *(theirs or {})}
                    if (theirs or {}).get(k) != ours.get(k))
    raise app.UsageError(f"--output={path} holds alphas measured with other settings "
                         f"({', '.join(differ)} differ); write elsewhere with --output, or "
                         "delete it to measure again.")
  return previous


def experiment(shared: settings.Settings) -> settings.Experiment:
  """The run as `registry.check` sees it: the shared settings, the flags' drafts and tasks.

  Raises:
    app.UsageError: a bad draft, task, target or setting (checked without weights).
  """
  drafts = _DRAFTS.value
  if drafts is None:
    if shared.target_kind != "t5":
      raise app.UsageError(f"--drafts: name the drafts of the {shared.target_kind!r} target, "
                           "e.g. --drafts=prompt_lookup,bigram,layer_skip_8.")
    drafts = list(family.DRAFTS)
  temperatures = tuple(float(t) for t in _TEMPERATURES.value)
  fields = {f.name: getattr(shared, f.name) for f in dataclasses.fields(settings.Settings)}
  try:
    exp = settings.Experiment(**fields, name="measure_alpha", drafts=tuple(drafts),
                              tasks=tuple(_TASKS.value), split=_SPLIT.value,
                              temperatures=temperatures)
    registry.check(exp)
  except (ValueError, FileNotFoundError, ImportError) as e:
    raise app.UsageError(f"{e} (Experiment.drafts / tasks are --drafts / --tasks here.)") from e
  return exp


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  exp = experiment(gin_flags.load_settings(gin_flags.GIN_FILE.value,
                                          gin_flags.GIN_BINDINGS.value))
  output = _OUTPUT.value
  previous = previous_rows(output, exp)
  kind = registry.target_kind(exp.target_kind)
  placement = gin_flags.placement()
  with jax.set_mesh(placement.mesh):
    target = kind.load(exp, placement)
    inputs, examples = {}, {}
    for task in exp.tasks:
      pairs = prompts.load_examples(task, exp.split, None)[0]
      picked = spread(pairs, _NUM_EXAMPLES.value)
      examples[task] = (len(picked), len(pairs))
      tokens = target.tokenize(task, [x for x, _ in picked], exp.input_len)
      validation.check_token_ids("inputs", tokens, target.scorer.vocab_size)
      inputs[task] = [buckets.to_bucket(jnp.asarray(b))
                      for b in batches(tokens, _BATCH_SIZE.value)]
    alpha = previous.get("alpha", {})
    drafts: dict[tuple[str, str], Draft] = {}
    for spec in exp.drafts:
      draft_kind = kind.draft_kind(spec)
      for task in exp.tasks:
        key = interface.draft_key(draft_kind, spec, task)
        if key not in drafts:
          drafts[key] = draft_kind.build(target, spec, key[1])
          validation.check_draft(drafts[key], target.scorer.vocab_size, inputs[task][0], None,
                                 target.encoder_width, target.scorer.feature_size)
        for temperature in exp.temperatures:
          row = measure(target, drafts[key], inputs[task], gamma=exp.gamma,
                        max_decode_len=exp.max_decode_len, temperature=temperature,
                        seed=exp.seed)
          alpha.setdefault(spec, {}).setdefault(task, {})[temperature_key(temperature)] = row
          print(f"{spec} {task} {temperature_key(temperature)}: alpha {row['alpha_beta']:.3f} "
                f"(S/(S+R) {row['alpha_empirical']:.3f}), {row['tokens_per_call']:.2f} "
                "tokens/call", flush=True)
          if distributed.is_primary():
            atomic_io.write_json(output, {"alpha": dict(sorted(alpha.items())),
                                          DETAILS: details(exp, target, examples,
                                                           previous.get(DETAILS, {}))})
  print(f"Wrote {output}.")


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
