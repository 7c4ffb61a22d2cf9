"""Drafts whose output layer scores a shortlist: alpha and c against the shortlist's size.

A draft's c is its seconds per proposed token over the target's T_step, and its
`[d_model, vocab]` logits matrix is the largest weight it streams per proposal. Keeping
only the `head` tokens the target emits most often (`distillation.head_tokens`, ranked
on its stored distillation outputs, both corpora weighing the same) cuts that stream to
`head / vocab`, and costs alpha only where the target puts mass outside the shortlist.
`head_sweep` measures both sides for each draft and head size: held-out En-De alpha with
the real speculative loop (`alpha_tracking.AlphaProbe`, the training curves' settings),
and c timed in turn with every other variant inside the guard, then the model calls'
predicted speedup (alpha, c, T_verify(k)). Every draft is measured with its weights
rounded to float16, as the shipped family stores them (`checkpoints.rounded_to_half`).
`python -m benchmarks draft_heads` is its command.
"""

from __future__ import annotations

import datetime
import os

import jax

from specdec_jax import contention
from specdec_jax.costs import gamma_choice, timing
from specdec_jax.data import layout
from specdec_jax.data.distill import read_distilled
from specdec_jax.decoding import buckets
from specdec_jax.decoding.sampling import Warp
from specdec_jax.distillation import head_tokens
from specdec_jax.draft_pricing.t5_runs import INPUT_LEN, TASK
from specdec_jax.models.t5 import T5Model, T5Scorer, make_draft
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_model, rounded_to_half
from specdec_jax.training import alpha_tracking

FULL = "full"


def draft_name(draft_dir: str) -> str:
  """A draft's name: its directory's, or the run's for a run's `best/` export."""
  path = os.path.normpath(draft_dir)
  if os.path.basename(path) == alpha_tracking.BEST_DIR:
    path = os.path.dirname(path)
  return os.path.basename(path)


def head_sweep(draft_dirs: list[str], head_sizes: list[int], *, target_dir: str,
               examples: int = 128, temperatures: tuple[float, ...] = (0.0, 1.0),
               gamma: int = 3, max_decode_len: int = 64, max_gamma: int = 8,
               timing_calls: int = 32, timing_repeats: int = 11) -> dict:
  """Alpha and c of each draft with its full output layer and each shortlist size.

  Args:
    draft_dirs: draft model directories (`checkpoints.load_model`'s).
    head_sizes: shortlist sizes, each below the vocabulary.
    target_dir: the target (HF T5) the drafts propose for.
    examples: En-De validation inputs alpha is measured on (evenly spaced).
    temperatures: sampling temperatures.
    gamma: draft tokens per target call, for alpha and for the draft's timing.
    max_decode_len: the most tokens per output.
    max_gamma: the speedup's gamma candidates are 1..max_gamma.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).

  Returns:
    The JSON record: per draft and head (FULL or the size), the shortlist's coverage
    of the target's output tokens and, per temperature, alpha (beta and S / (S + R)),
    c, and the model calls' best predicted speedup with its gamma.

  Raises:
    FileNotFoundError: the distillation data or the corpora are not prepared.
    ValueError: a head size outside [2, vocab).
  """
  target_cfg, target_params = load_hf_checkpoint(target_dir, dropout_rate=0.0)
  vocab = target_cfg.vocab_size
  if any(not 2 <= s < vocab for s in head_sizes):
    raise ValueError(f"head_sizes {head_sizes} must each be in [2, {vocab}) (the vocabulary).")
  frequencies = head_tokens.token_frequencies(
      {corpus: read_distilled(corpus) for corpus in layout.CORPORA}, vocab)
  heads = {FULL: None, **{str(s): head_tokens.frequent_tokens(
      frequencies, s, always=[target_cfg.eos_token_id]) for s in sorted(head_sizes, reverse=True)}}
  target_model = T5Model(target_cfg)
  target_params = jax.device_put(target_params)
  target = T5Scorer(target_model, target_model.prepare(target_params))
  probe = alpha_tracking.AlphaProbe(
      target_model, target.params, alpha_tracking.held_out_inputs([TASK], examples, INPUT_LEN),
      temperatures=tuple(temperatures), gamma=gamma, max_decode_len=max_decode_len,
      batch_size=32, seed=0)
  variants, drafts = {}, {}
  for draft_dir in draft_dirs:
    model, params = load_model(draft_dir, dropout_rate=0.0)
    params = jax.device_put(rounded_to_half(params))
    name = draft_name(draft_dir)
    for head, tokens in heads.items():
      drafts[(name, head)] = make_draft(model, params, tokens)
      alphas = probe.measure_draft(drafts[(name, head)])[TASK]
      variants[(name, head)] = {
          "coverage": 1.0 if tokens is None else head_tokens.coverage(frequencies, tokens),
          "alpha": {t: {"beta": a.beta, "empirical": a.empirical} for t, a in alphas.items()}}
  timing_input = buckets.to_bucket(probe.inputs[TASK][:1])
  encoded = target.encoder_outputs(target.encode(timing_input))
  cache_len, position = timing.timing_geometry(max_decode_len, max_gamma)
  with contention.quiet("draft heads") as guard:
    verify = timing.verify_times(target, timing_input, max_gamma=max_gamma,
                                max_decode_len=max_decode_len, calls=timing_calls,
                                repeats=timing_repeats)
    for t in temperatures:
      t_draft = timing.draft_token_times_rotated(
          {key: (d, timing_input, encoded if d.reads_target_encoder else None)
           for key, d in drafts.items()},
          gamma=gamma, warp=Warp(temperature=t), cache_len=cache_len, position=position,
          calls=timing_calls, repetitions=timing_repeats)
      for key, variant in variants.items():
        alpha = variant["alpha"][alpha_tracking.temperature_key(t)]
        choice = gamma_choice.make_choice(alpha["beta"], verify.t_chunk, t_draft[key],
                                          max_gamma=max_gamma)
        best = max(choice.speedup_steps_only, key=choice.speedup_steps_only.get)
        alpha.update(c=choice.c, gamma_steps_only=best,
                     speedup_steps_only=choice.speedup_steps_only[best])
  out: dict[str, dict] = {}
  for (name, head), variant in variants.items():
    out.setdefault(name, {})[head] = variant
  return {
      "what": "drafts whose output layer scores the target's most frequent tokens: held-out "
              "En-De alpha, c and the model calls' predicted speedup against the head's size",
      "command": "python -m benchmarks draft_heads", "target": target_dir, "task": TASK,
      "examples": examples, "gamma": gamma, "timing_calls": timing_calls,
      "timing_repeats": timing_repeats, "t_step_s": verify.t_step,
      "verify_ratio": {str(k): t / verify.t_step for k, t in verify.t_chunk.items()},
      "ranking": "the target's distillation outputs, per-corpus token shares averaged over "
                 f"{sorted(layout.CORPORA)}; EOS always kept",
      "drafts": out, "idle_check": guard.record(), "environment": timing.environment(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
