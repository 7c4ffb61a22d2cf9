"""Times our baseline greedy decoder against HuggingFace's `generate` on the same weights.

  python -m experiments.benchmark_baseline [--config=t5-v1_1-small] [--new_tokens=64]

A randomly initialised model (ours, T5X init) is saved in HF format and loaded
by `T5ForConditionalGeneration.from_pretrained`, so both implementations run
the same weights on the same prompts at batch 1. The EOS id is one neither
emits, so both generate exactly `--new_tokens` tokens, and the tokens must be
identical. Calls alternate (ours, theirs, theirs, ours, ...) so that load from
other processes hits both alike; the first call of each (compilation for us,
warm-up for PyTorch) is reported apart from the medians of the rest
(`benchmarking.time_interleaved`).
Appends one row to `--output` (a JSON list, replaced atomically).
"""

from __future__ import annotations

import datetime
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from absl import app, flags, logging

from specdec_jax import benchmarking, contention
from specdec_jax.checkpoints import save_hf_checkpoint
from specdec_jax.harness import results_io
from specdec_jax.models.t5 import T5Model, get_config, temperature_sample

_CONFIG = flags.DEFINE_enum("config", "t5-v1_1-small", ["t5-v1_1-small", "t5-small"],
                            "Architecture of the randomly initialised model.")
_VOCAB = flags.DEFINE_integer("vocab_size", 32128, "Vocabulary size (prompts use ids 2 to "
                              "vocab_size - 2, EOS is the last id).", lower_bound=4)
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "Tokens generated per call (exactly).",
                                   lower_bound=1)
_INPUT_LEN = flags.DEFINE_integer("input_len", 32, "Prompt length in tokens.", lower_bound=1)
_PROMPTS = flags.DEFINE_integer("num_prompts", 3, "Distinct random prompts.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed passes over the prompts, per side.",
                                lower_bound=1)
_THREADS = flags.DEFINE_integer("threads", os.cpu_count(), "torch.set_num_threads.",
                                lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and prompts.", lower_bound=0,
                             upper_bound=2**32 - 1)
_OUTPUT = flags.DEFINE_string("output", "results/baseline_benchmark/results.json",
                              "JSON list the result row is appended to.")


def main(argv: list[str]) -> None:
  del argv
  torch.set_num_threads(_THREADS.value)
  n_new = _NEW_TOKENS.value
  cfg = get_config(_CONFIG.value, vocab_size=_VOCAB.value)
  model = T5Model(cfg)
  start = time.perf_counter()
  params = jax.device_get(model.init_params(jax.random.PRNGKey(_SEED.value)))
  logging.info("Initialised %s in %.1f s.", _CONFIG.value, time.perf_counter() - start)

  with tempfile.TemporaryDirectory() as tmp:
    save_hf_checkpoint(os.path.join(tmp, "hf"), cfg, params)
    hf = transformers.T5ForConditionalGeneration.from_pretrained(os.path.join(tmp, "hf")).eval()
  params = model.prepare(jax.device_put(params))  # Once, held for every call.

  rng = np.random.RandomState(_SEED.value)
  # The last id (an unused sentinel in T5 vocabularies) as EOS: checked below to be
  # emitted by neither side, so both generate exactly n_new tokens.
  eos_id = cfg.vocab_size - 1
  prompts = [rng.randint(2, eos_id, size=(1, _INPUT_LEN.value)).astype(np.int32)
             for _ in range(_PROMPTS.value)]

  def ours(prompt: np.ndarray) -> np.ndarray:
    out = temperature_sample(model, params, jnp.asarray(prompt), max_decode_len=n_new,
                             eos_id=eos_id)
    return np.asarray(out.sequences)

  def theirs(prompt: np.ndarray) -> np.ndarray:
    ids = torch.from_numpy(prompt).long()
    with torch.inference_mode():
      out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                        max_new_tokens=n_new, eos_token_id=eos_id, pad_token_id=0,
                        decoder_start_token_id=0)
    return out.numpy()[:, 1:]

  def check(i: int, tokens: dict[str, np.ndarray]) -> None:
    for name, seq in tokens.items():
      if seq.shape != (1, n_new) or eos_id in seq:
        raise RuntimeError(f"{name} did not generate exactly {n_new} tokens: {seq}")
    if not np.array_equal(tokens["ours"], tokens["theirs"]):
      first = int(np.argmax(tokens["ours"][0] != tokens["theirs"][0]))
      raise RuntimeError(f"greedy tokens differ from step {first} on prompt {i}: "
                         f"ours {tokens['ours'][0, first:first + 5]}, "
                         f"theirs {tokens['theirs'][0, first:first + 5]}")

  sides = {"ours": lambda i: ours(prompts[i]), "theirs": lambda i: theirs(prompts[i])}
  with contention.quiet("experiments.benchmark_baseline") as guard:
    timings, _ = benchmarking.time_interleaved(sides, len(prompts), _REPEATS.value,
                                               check=check)
  first_call_s = {name: sum(t.first_s) for name, t in timings.items()}
  # Every timed call, pass by pass (each generates exactly n_new tokens).
  times = {name: [s for calls in t.calls_s for s in calls] for name, t in timings.items()}

  ms_per_token = {name: 1e3 * statistics.median(t) / n_new for name, t in times.items()}
  ratio = ms_per_token["theirs"] / ms_per_token["ours"]
  compile_s = timings["ours"].compile_s  # The harness's one definition.
  row = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "config": _CONFIG.value,
      "vocab_size": cfg.vocab_size,
      "batch": 1,
      "input_len": _INPUT_LEN.value,
      "new_tokens": n_new,
      "num_prompts": _PROMPTS.value,
      "repeats": _REPEATS.value,
      "ours_ms_per_token": ms_per_token["ours"],
      "theirs_ms_per_token": ms_per_token["theirs"],
      "ratio_theirs_over_ours": ratio,
      "ours_first_call_s": first_call_s["ours"],
      "ours_compile_s": compile_s,
      "theirs_first_call_s": first_call_s["theirs"],
      "ours_call_s": times["ours"],
      "theirs_call_s": times["theirs"],
      "tokens_identical": True,
      "idle_check": guard.record(),
      "transformers": transformers.__version__,
      "torch_threads": torch.get_num_threads(),
      **benchmarking.environment(),
  }
  results_io.append_to_json_list(_OUTPUT.value, row)

  print(f"{_CONFIG.value} (vocab {cfg.vocab_size}), batch 1, {_INPUT_LEN.value}-token prompts, "
        f"{n_new} new tokens, {_PROMPTS.value} prompts x {_REPEATS.value} passes; "
        f"{row['cpu_model']}, {row['cpu_count']} cores; jax {jax.__version__}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
  print(f"{'':<28}{'ms/token (median)':>18}{'first call s':>14}")
  print(f"{'ours (temperature_sample)':<28}{ms_per_token['ours']:>18.2f}"
        f"{first_call_s['ours']:>14.2f}  (compile ~{compile_s:.2f} s)")
  print(f"{'HF generate (PyTorch)':<28}{ms_per_token['theirs']:>18.2f}"
        f"{first_call_s['theirs']:>14.2f}")
  verdict = "ours at least as fast" if ratio >= 1 else "ours slower"
  print(f"ratio theirs/ours = {ratio:.2f} ({verdict}); tokens identical; "
        f"row appended to {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
