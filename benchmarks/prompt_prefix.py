r"""The chat template's system turn prefilled once against prefilled in every prompt.

Every chat prompt of a GGUF target starts with the same tokens (the template's system turn,
`chat_prompts.shared_prefix`). `LlamaScorer.with_prefix` prefills them once and copies their
cache into every row, so each example prefills only the rest (`PromptCache.shared_prefix`).
On the test prompts of the chat tasks, batch 1, cut to their length bucket as the runner cuts
them, this times side by side (`timing.time_interleaved`: calls rotated per prompt and
pass, first calls apart) the target's once-per-example work (`init_state`: the prefill) and a
whole greedy baseline decoding, with and without the prefix, inside the timing guard; the
greedy tokens of the two must be identical.

  python -m benchmarks prompt_prefix --output=results/llama_smollm2/prompt_prefix.json
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from specdec_jax import atomic_io, contention
from specdec_jax.costs import timing
from specdec_jax.data import chat_prompts
from specdec_jax.decoding import baseline, buckets
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama import LlamaModel, LlamaScorer, gguf_loader, pad_prompts
from specdec_jax.models.options import DecodeOptions

_TASKS = flags.DEFINE_list("tasks", list(chat_prompts.TASKS), "Chat tasks whose test prompts "
                           "are timed.")
_EXAMPLES = flags.DEFINE_integer("examples", 8, "Test prompts per task.", lower_bound=1)
_INPUT_LEN = flags.DEFINE_integer("input_len", 128, "Prompt width (Settings.input_len).",
                                  lower_bound=8)
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 48, "Tokens per greedy decoding.",
                                       lower_bound=1)
_PASSES = flags.DEFINE_integer("passes", 3, "Timed passes over the prompts.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "results/llama_smollm2/prompt_prefix.json",
                              "JSON file written atomically.")


def main(argv: Sequence[str]) -> None:
  del argv
  checkpoint = gguf_loader.load_gguf()
  options = DecodeOptions.for_backend()
  model = LlamaModel(checkpoint.config.replace(dtype="float32", param_dtype="float32"),
                     options=options)  # As the runner loads it on a CPU (Settings.dtype).
  vocabulary, tokenizer = checkpoint.vocabulary, checkpoint.vocabulary.tokenizer()
  whole = LlamaScorer(model, model.prepare(checkpoint.params))
  prefix = chat_prompts.shared_prefix(vocabulary, tokenizer)
  scorers = {"whole prompt": whole, "prefix once": whole.with_prefix(jnp.asarray(prefix))}
  batches = [jnp.asarray(buckets.to_bucket(pad_prompts([p], _INPUT_LEN.value)))
             for task in _TASKS.value for p in chat_prompts.build_prompts(
                 vocabulary, task, "test", _EXAMPLES.value, _INPUT_LEN.value)]
  cache_len = _MAX_DECODE_LEN.value + 1
  prefill = jax.jit(lambda s, x: s.init_state(s.encode(x), cache_len).cache)
  decoders = {}
  for name, scorer in scorers.items():
    decoders[f"prefill, {name}"] = lambda i, s=scorer: prefill(s, batches[i])
    decoders[f"greedy decoding, {name}"] = lambda i, s=scorer: baseline.decode(
        s, batches[i], jax.random.PRNGKey(0), max_decode_len=_MAX_DECODE_LEN.value,
        warp=Warp(0.0), eos_id=vocabulary.eos_id)

  def check(i: int, out: dict) -> None:
    tokens = [np.asarray(out[f"greedy decoding, {n}"].sequences) for n in scorers]
    if not np.array_equal(*tokens):
      raise RuntimeError(f"prompt {i}: the prefixed scorer's greedy tokens differ.")

  with contention.quiet("benchmark_prompt_prefix") as guard:
    timings, _ = timing.time_interleaved(
        decoders, len(batches), _PASSES.value, check=check,
        warmup=timing.first_of_each_shape(batches))
  ms = {name: 1e3 * t.median_s / len(batches) for name, t in timings.items()}
  for name, value in ms.items():
    print(f"{name:>30}: {value:8.2f} ms per prompt (compile {timings[name].compile_s:.1f} s)")
  ratios = {kind: ms[f"{kind}, whole prompt"] / ms[f"{kind}, prefix once"]
            for kind in ("prefill", "greedy decoding")}
  for kind, ratio in ratios.items():
    print(f"{kind}: the prefix once is {ratio:.3f}X the whole prompt's speed")
  lengths = [int(b.shape[1]) for b in batches]
  atomic_io.write_json(_OUTPUT.value, {
      "command": "python -m benchmarks prompt_prefix", "tasks": _TASKS.value,
      "examples_per_task": _EXAMPLES.value, "prefix_tokens": len(prefix),
      "bucket_lengths_median": statistics.median(lengths), "max_decode_len":
      _MAX_DECODE_LEN.value, "passes": _PASSES.value, "ms_per_prompt": ms,
      "compile_s": {n: t.compile_s for n, t in timings.items()},
      "speed_ratio_prefix_once": ratios, "greedy_identical": True,
      "idle_check": guard.record(), "environment": timing.environment(
          options.provenance())})
  print(f"wrote {_OUTPUT.value}")
