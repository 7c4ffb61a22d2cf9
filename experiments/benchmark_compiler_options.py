r"""Both decoding loops under the shipped XLA options and under others, in one process.

Decodes the same En-De test examples (batch 1) with the baseline and with
speculative decoding, each once with the target's own compiler options
(`DecodeOptions.compiler_options`, `DecodeOptions.for_backend()`'s) and once
with `--options` laid over them (a copy of the target whose options hold them:
the loops compile with their target's, `decoding.programs`): four
decoders, interleaved by `benchmarking.time_interleaved`, so all four see the
same machine. Per decoder: median ms per generated token over the calls. Per
side: the median over calls of the paired ratio (the same example and pass)
of the options' time over the shipped one's. The encoders run as their own
programs, the same in both; they are in the times. Greedy tokens must agree
between the four (checked on every call); at temperature > 0 each side
draws the same random numbers under both sets of options.

  python -m experiments.benchmark_compiler_options \
      --options='{"xla_cpu_enable_concurrency_optimized_scheduler": true}' \
      --output=results/loop_overhead/compiler_options.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm
from absl import app, flags

from specdec_jax import atomic_io, benchmarking, contention
from specdec_jax.checkpoints import load_model
from specdec_jax.data import prompts
from specdec_jax.decoding.buckets import to_bucket
from specdec_jax.models.t5 import make_draft, speculative_sample, temperature_sample

_OPTIONS = flags.DEFINE_string("options", None, "JSON object of XLA options to lay over "
                               "the target's DecodeOptions.compiler_options.", required=True)
_TARGET_DIR = flags.DEFINE_string("target_dir", "assets/models/target", "Target checkpoint.")
_DRAFT_DIR = flags.DEFINE_string("draft_dir", "assets/models/draft_shared_enc_signals",
                                 "Draft checkpoint.")
_GAMMA = flags.DEFINE_integer("gamma", 2, "Proposals per iteration.", lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature of both sides.",
                                  lower_bound=0.0)
_EXAMPLES = flags.DEFINE_integer("examples", 16, "En-De test examples, one per call.",
                                 lower_bound=1)
_PASSES = flags.DEFINE_integer("passes", 4, "Timed passes over the examples.", lower_bound=1)
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 64, "Most tokens per example.",
                                       lower_bound=1)
_INPUT_LEN = flags.DEFINE_integer("input_len", 128, "Encoder tokens before the length bucket.",
                                  lower_bound=2)
_OUTPUT = flags.DEFINE_string("output", "results/loop_overhead/compiler_options.json",
                              "JSON file written atomically.")


def parse_options(text: str) -> dict[str, Any]:
  """The `--options` JSON object; a UsageError naming the flag otherwise."""
  try:
    options = json.loads(text)
  except json.JSONDecodeError as e:
    raise app.UsageError(f"--options must be a JSON object, e.g. "
                         f"'{{\"xla_cpu_enable_fast_min_max\": true}}': {e}") from e
  if not isinstance(options, dict) or not options:
    raise app.UsageError(f"--options must be a non-empty JSON object, got {text!r}.")
  return options


def main(argv: Sequence[str]) -> None:
  del argv
  options = parse_options(_OPTIONS.value)
  target, target_params = load_model(_TARGET_DIR.value)
  draft_model, draft_params = load_model(_DRAFT_DIR.value)
  target_params = target.prepare(jax.device_put(target_params))
  draft = make_draft(draft_model, jax.device_put(draft_params))
  processor = spm.SentencePieceProcessor(model_file=prompts.VOCAB_PATH)
  pairs, _ = prompts.load_examples("ende", "test", _EXAMPLES.value)
  tokens = prompts.tokenize(processor, [source for source, _ in pairs], _INPUT_LEN.value)
  batches = [to_bucket(jnp.asarray(tokens[i:i + 1])) for i in range(len(pairs))]
  settings = {"max_decode_len": _MAX_DECODE_LEN.value, "temperature": _TEMPERATURE.value}

  def decoder(side: str, overrides: dict[str, Any]):
    shipped = dict(target.options.compiler_options)
    model = dataclasses.replace(target, options=target.options.replace(
        compiler_options={**shipped, **overrides}))

    def decode(i: int):
      if side == "baseline":
        return temperature_sample(model, target_params, batches[i], **settings)
      return speculative_sample(model, target_params, draft, batches[i], gamma=_GAMMA.value,
                                rng=jax.random.PRNGKey(i), **settings)
    return decode

  variants = {"shipped": {}, "options": options}
  decoders = {f"{side}/{name}": decoder(side, overrides)
              for side in ("baseline", "speculative") for name, overrides in variants.items()}

  def check(i: int, outputs: dict[str, Any]) -> None:
    if _TEMPERATURE.value == 0 and len({out.sequences.tobytes()
                                        for out in outputs.values()}) != 1:
      raise RuntimeError(f"greedy outputs differ on example {i}.")

  with contention.quiet("benchmark_compiler_options") as guard:
    timings, outputs = benchmarking.time_interleaved(
        decoders, len(batches), _PASSES.value, check=check,
        warmup=benchmarking.first_of_each_shape(batches))
  tokens_of = {name: [int(out.lengths[0]) for out in outs] for name, outs in outputs.items()}
  per_token = {name: [[s / tokens_of[name][i] for i, s in enumerate(calls)]
                      for calls in timing.calls_s] for name, timing in timings.items()}
  summary: dict[str, Any] = {}
  for name in decoders:
    summary[f"{name}_ms_per_token"] = 1e3 * statistics.median(np.ravel(per_token[name]))
    summary[f"{name}_compile_s"] = timings[name].compile_s
  for side in ("baseline", "speculative"):
    ratios = np.ravel(per_token[f"{side}/options"]) / np.ravel(per_token[f"{side}/shipped"])
    summary[f"{side}_options_over_shipped"] = float(np.median(ratios))
    summary[f"{side}_options_over_shipped_p10_p90"] = [float(np.percentile(ratios, 10)),
                                                       float(np.percentile(ratios, 90))]
  for name in variants:
    speedups = (np.ravel(per_token[f"baseline/{name}"])
                / np.ravel(per_token[f"speculative/{name}"]))
    summary[f"speedup_{name}"] = float(np.median(speedups))
  for key, value in summary.items():
    print(f"{key}: {np.round(value, 3).tolist()}")
  atomic_io.write_json(_OUTPUT.value, {
      "command": "python -m experiments.benchmark_compiler_options "
                 f"--options='{_OPTIONS.value}' --gamma={_GAMMA.value} "
                 f"--temperature={_TEMPERATURE.value:g} --examples={_EXAMPLES.value} "
                 f"--passes={_PASSES.value}",
      "shipped_options": dict(target.options.compiler_options), "options": options,
      "target_dir": _TARGET_DIR.value, "draft_dir": _DRAFT_DIR.value, "batch": 1,
      "summary": summary, "idle_check": guard.record(),
      "environment": benchmarking.environment(target.options.provenance())})
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
