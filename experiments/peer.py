"""Our decoders side by side with HuggingFace transformers, on the same weights and prompts.

  python -m experiments.peer [--draft=draft_small] [--task=ende] [--num_examples=4] \
      [--gin.Settings.gamma=3] [--gin.Settings.models_dir="'assets/models'"]
  python -m experiments.peer --gin_file=gin_configs/llama_smollm2.gin --draft=layer_skip_8 \
      [--task=mansum]

At batch 1 and temperature 0, four decoders generate for the same prompts:
our baseline and speculative decoder, and transformers' greedy `generate` and
its assisted generation. All four must produce identical tokens (reported, and
the run fails if not). Calls rotate their order per prompt and repetition;
first calls (compilation / warm-up) are reported apart
(`timing.time_interleaved`). The target kind, models directory, target,
lengths and gamma are the shared `Settings` (gin):

  * "t5": our `temperature_sample` / `speculative_sample` against
    `T5ForConditionalGeneration` with the draft checkpoint as `assistant_model=`
    (a constant `num_assistant_tokens=gamma`, no confidence cut-off, so it
    always drafts gamma tokens like ours);
  * "llama_gguf": `baseline.decode` / `speculative_decode` on the GGUF file's
    `LlamaScorer` against `AutoModelForCausalLM` reading the same file
    (`gguf_file=`), on the same chat prompts; the draft "layer_skip_<L>" is
    transformers' `assistant_early_exit=L` (the same first L layers, final
    norm and head), "prompt_lookup" its `prompt_lookup_num_tokens=gamma`
    (n-grams up to 3, as ours), and a trained "draft_<name>"
    (`models.llama.student`) its `assistant_model=` as a transformers Llama model
    with the same weights and shortlist (`student_hf.to_transformers`), drafting a
    constant gamma tokens.

Writes `<output_dir>/peer_<target>_<draft>_<task>_g<gamma>.json` atomically.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm
import torch
import transformers
from absl import app, flags

from specdec_jax import atomic_io, contention, partitioning
from specdec_jax.costs import timing
from specdec_jax.data import chat_prompts, layout, prompts
from specdec_jax.decoding import baseline, buckets, speculative
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment import gin_flags, settings
from specdec_jax.experiment.targets import interface, llama_target
from specdec_jax.models.llama import student_io
from specdec_jax.models.llama.student_hf import check_exportable, to_transformers
from specdec_jax.models.t5 import T5Model, make_draft, speculative_sample, temperature_sample
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_hf_config

_DRAFT = flags.DEFINE_string(
    "draft", "draft_small", "Draft: a checkpoint (in Settings.models_dir) of a T5 target; "
    "layer_skip_<L>, prompt_lookup or a trained draft_<name> of a llama_gguf one.")
_TASK = flags.DEFINE_enum("task", "ende", sorted({*layout.CORPORA, *chat_prompts.TASKS}),
                          "Task of the prompts (a chat task such as explain: a llama_gguf "
                          "target's).")
_NUM = flags.DEFINE_integer("num_examples", 4, "Prompts (the split's first ones).",
                            lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed passes over the prompts.", lower_bound=1)
_THREADS = flags.DEFINE_integer("threads", os.cpu_count(), "torch.set_num_threads.",
                                lower_bound=1)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", os.path.join("results", "peer"),
                                  "Where the JSON goes.")

Decoder = Callable[[np.ndarray], list[int]]


def _trim(tokens: np.ndarray, eos_id: int) -> list[int]:
  """Generated ids up to and including the first EOS."""
  tokens = [int(t) for t in tokens]
  return tokens[:tokens.index(eos_id) + 1] if eos_id in tokens else tokens


def _t5_peer(shared: settings.Settings, task: str, placement: partitioning.Placement
             ) -> tuple[dict[str, Decoder], list[np.ndarray], str, str]:
  """The T5 target's four decoders, the prompts they decode, the target and the draft."""
  del placement  # Its parameters are placed on the default device.
  target_dir, draft_dir = shared.checkpoint_dir(shared.target), shared.checkpoint_dir(_DRAFT.value)
  # Both configs are checked before any weights load.
  target_vocab, draft_vocab = (load_hf_config(d).vocab_size for d in (target_dir, draft_dir))
  if draft_vocab != target_vocab:
    raise app.UsageError(f"--draft={_DRAFT.value} has a vocabulary of {draft_vocab}, "
                         f"Settings.target={shared.target} of {target_vocab}; pick a draft "
                         "that shares the target's vocabulary.")
  decoders = _t5_decoders(target_dir, draft_dir, shared.gamma, shared.max_decode_len)
  pairs, _ = prompts.load_examples(task, "test", _NUM.value)
  processor = spm.SentencePieceProcessor(model_file=shared.vocab_path)
  inputs = [buckets.to_bucket(x[None]) for x in prompts.tokenize(
      processor, [x for x, _ in pairs], shared.input_len)]  # Both sides' encoders alike.
  return decoders, inputs, target_dir, draft_dir


def _t5_decoders(target_dir: str, draft_dir: str, gamma: int, max_len: int
                 ) -> dict[str, Decoder]:
  """The four greedy decoders, each mapping int32 `[1, input_len]` -> generated ids."""
  cfg, params = load_hf_checkpoint(target_dir)
  draft_cfg, draft_params = load_hf_checkpoint(draft_dir)
  target = T5Model(cfg)
  params = target.prepare(jax.device_put(params))  # Once: every call reuses them.
  draft = make_draft(T5Model(draft_cfg), jax.device_put(draft_params))
  eos = cfg.eos_token_id
  # float32 like ours, whatever the stored dtype (the shipped family is stored in float16).
  load = lambda path: transformers.T5ForConditionalGeneration.from_pretrained(
      path, dtype=torch.float32).eval()
  hf_target, hf_draft = load(target_dir), load(draft_dir)
  hf_draft.generation_config.num_assistant_tokens = gamma
  hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
  hf_draft.generation_config.assistant_confidence_threshold = 0.0  # Always draft gamma.

  def ours_baseline(x: np.ndarray) -> list[int]:
    out = temperature_sample(target, params, jnp.asarray(x), max_decode_len=max_len)
    return _trim(np.asarray(out.sequences[0]), eos)

  def ours_speculative(x: np.ndarray) -> list[int]:
    out = speculative_sample(target, params, draft, jnp.asarray(x), gamma=gamma,
                             max_decode_len=max_len)
    return _trim(np.asarray(out.sequences[0]), eos)

  def hf(x: np.ndarray, **kwargs) -> list[int]:
    ids = torch.from_numpy(x).long()
    with torch.inference_mode():
      out = hf_target.generate(input_ids=ids, attention_mask=(ids != cfg.pad_token_id).long(),
                               do_sample=False, max_new_tokens=max_len, eos_token_id=eos,
                               pad_token_id=cfg.pad_token_id,
                               decoder_start_token_id=cfg.decoder_start_token_id, **kwargs)
    return _trim(out.numpy()[0, 1:], eos)

  return {"ours_baseline": ours_baseline, "ours_speculative": ours_speculative,
          "hf_greedy": hf, "hf_assisted": lambda x: hf(x, assistant_model=hf_draft)}


def _llama_peer(shared: settings.Settings, task: str, placement: partitioning.Placement
                ) -> tuple[dict[str, Decoder], list[np.ndarray], str, str]:
  """The GGUF Llama's four decoders on its chat prompts, the target and the draft."""
  spec, gamma, max_len = _DRAFT.value, shared.gamma, shared.max_decode_len
  kind = llama_target.KIND.draft_kind(spec)
  if kind is llama_target.LAYER_SKIP:
    llama_target.LAYER_SKIP.check(shared, spec, 0)
    assisted = {"assistant_early_exit": llama_target.layer_skip_depth(spec)}
  elif kind is interface.PROMPT_LOOKUP:
    assisted = {"prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": 3}
  elif kind is llama_target.STUDENT:
    llama_target.STUDENT.check(shared, spec, llama_target.read_config(shared).vocab_size)
    saved = student_io.load_student(shared.checkpoint_dir(spec))
    try:  # Before any weights load.
      check_exportable(saved.config)
    except ValueError as e:
      raise app.UsageError(f"--draft={spec}: {e}") from None
  else:
    raise app.UsageError(f"--draft={spec}: transformers has no {kind.name} draft; use "
                         "layer_skip_<L>, prompt_lookup or a trained draft_<name>.")
  path = llama_target.gguf_path(shared)
  target = llama_target.load(shared, placement)
  draft, eos = kind.build(target, spec, task), target.eos_id
  if kind is llama_target.STUDENT:  # The same weights as a transformers Llama model.
    assistant = to_transformers(saved.config, saved.params, np.asarray(target.weights.embedding),
                                saved.head_tokens)
    assistant.generation_config.num_assistant_tokens = gamma
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0  # Always draft gamma.
    assisted = {"assistant_model": assistant}
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
  pairs, _ = prompts.load_examples(task, "test", _NUM.value)
  inputs = [buckets.to_bucket(x[None]) for x in target.tokenize(
      task, [x for x, _ in pairs], shared.input_len)]
  kwargs = dict(max_decode_len=max_len, warp=Warp(), eos_id=eos)

  def ours_baseline(x: np.ndarray) -> list[int]:
    out = baseline.decode(target.scorer, jnp.asarray(x), jax.random.PRNGKey(0), **kwargs)
    return _trim(np.asarray(out.sequences[0]), eos)

  def ours_speculative(x: np.ndarray) -> list[int]:
    x = jnp.asarray(x)
    out = speculative.speculative_decode(target.scorer, draft, x, jax.random.PRNGKey(0),
                                         gamma=gamma, draft_inputs=x, **kwargs)
    return _trim(np.asarray(out.sequences[0]), eos)

  def hf(x: np.ndarray, **extra) -> list[int]:
    ids = torch.from_numpy(x[:, :int(np.count_nonzero(x))]).long()  # The prompt, unpadded.
    with torch.inference_mode():
      out = hf_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              do_sample=False, max_new_tokens=max_len, eos_token_id=eos,
                              pad_token_id=eos, **extra)
    return _trim(out.numpy()[0, ids.shape[1]:], eos)

  decoders = {"ours_baseline": ours_baseline, "ours_speculative": ours_speculative,
              "hf_greedy": hf, "hf_assisted": lambda x: hf(x, **assisted)}
  return decoders, inputs, path, spec


PEERS = {"t5": _t5_peer, "llama_gguf": _llama_peer}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  shared = gin_flags.load_settings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  torch.set_num_threads(_THREADS.value)
  if shared.target_kind not in PEERS:
    raise app.UsageError(f"Settings.target_kind={shared.target_kind!r} has no peer here; use "
                         f"one of {sorted(PEERS)}.")
  placement = gin_flags.placement()
  with jax.set_mesh(placement.mesh):  # As experiments.run decodes.
    decoders, inputs, target_desc, draft_desc = PEERS[shared.target_kind](shared, _TASK.value,
                                                                          placement)
    names = list(decoders)
    with contention.quiet("experiments.peer") as guard:
      timings, outputs = timing.time_interleaved(
          {n: lambda i, fn=decoders[n]: fn(inputs[i]) for n in names}, len(inputs),
          _REPEATS.value, fetch=lambda out: out, warmup=timing.first_of_each_shape(inputs))
  _, source = prompts.load_examples(_TASK.value, "test", _NUM.value)

  reference = outputs["ours_baseline"]
  mismatches = [{"prompt": i, **{n: outputs[n][i] for n in names}}
                for i in range(len(inputs)) if any(outputs[n][i] != reference[i] for n in names)]
  tokens = sum(len(t) for t in reference)
  tokens_per_s = {n: tokens / timings[n].median_s for n in names}
  first_s = {n: sum(timings[n].first_s) for n in names}
  result = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "target_kind": shared.target_kind, "target": target_desc, "draft": draft_desc,
      "task": _TASK.value, "prompts_file": source,
      "num_examples": len(inputs), "gamma": shared.gamma, "max_decode_len": shared.max_decode_len,
      "input_len": shared.input_len, "batch_size": 1, "repeats": _REPEATS.value,
      "tokens": tokens,
      "identical": not mismatches,
      "mismatches": mismatches,
      "tokens_per_s": tokens_per_s,
      "seconds": {n: list(timings[n].totals_s) for n in names},
      "first_call_s": first_s,
      "ratio_ours_over_theirs": {
          "greedy": tokens_per_s["ours_baseline"] / tokens_per_s["hf_greedy"],
          "speculative": tokens_per_s["ours_speculative"] / tokens_per_s["hf_assisted"]},
      "speedup_speculative": {
          "ours": tokens_per_s["ours_speculative"] / tokens_per_s["ours_baseline"],
          "theirs": tokens_per_s["hf_assisted"] / tokens_per_s["hf_greedy"]},
      "transformers": transformers.__version__,
      "torch_threads": torch.get_num_threads(),
      "environment": timing.environment(),
      "idle_check": guard.record(),
  }
  path = os.path.join(_OUTPUT_DIR.value, f"peer_{shared.target}_{_DRAFT.value}_{_TASK.value}"
                                         f"_g{shared.gamma}.json")
  atomic_io.write_json(path, result)
  for n in names:
    print(f"{n:<18}{tokens_per_s[n]:>10.1f} tokens/s   warm-up {first_s[n]:.1f} s (our loops: "
          "their compilation)")
  print(f"ours/theirs: greedy {result['ratio_ours_over_theirs']['greedy']:.2f}X, speculative "
        f"{result['ratio_ours_over_theirs']['speculative']:.2f}X; written to {path}")
  if mismatches:
    raise RuntimeError(f"Greedy outputs differ between decoders on {len(mismatches)} prompt(s) "
                       f"(first: {mismatches[0]}); see {path}.")
  print(f"All four decoders produced identical tokens on {len(inputs)} prompts.")


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
