"""The checked entry points over a scorer of any family: `sample` and `speculative_sample`.

Each checks its arguments before any work (`validation.check_scorer_decode_args` /
`check_scorer_speculative_args`: the checks every family's entry points share), then
runs the model-free loop on the scorer as it is: `baseline.decode` (one token per
target call) or `speculative.speculative_decode` (gamma proposals per target call).
The target is a `T5Scorer`, a `LlamaScorer` or any other `Scorer`, the draft any
`drafts.Draft` of its vocabulary. gamma = 'auto' for the same pair is
`specdec_jax.costs.timing.choose_gamma` (it times, so it lives above the loops). The T5
entry points (`models.t5.temperature_sample` / `speculative_sample`) take a model and
its parameters instead, and add length buckets and a data-parallel mesh.
"""

from __future__ import annotations

import jax

from specdec_jax import validation
from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.baseline import DecodeOutput
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.decoding.speculative import SpeculativeOutput

Array = jax.Array


def sample(scorer: Scorer, inputs: Array, *, max_decode_len: int, eos_id: int,
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           rng: Array | None = None) -> DecodeOutput:
  """Samples (or, at temperature 0, greedily decodes) from any scorer: the baseline.

  Args:
    scorer: the model side (`decoding.scorer.Scorer`), e.g. `LlamaScorer(model, weights)`.
    inputs: int32 `[batch, input_len]`, 0-padded: what `scorer.encode` takes (an
      encoder's tokens, or a decoder-only model's prompts).
    max_decode_len: the most tokens to generate per row.
    eos_id: the end-of-sequence id.
    temperature: 0 for greedy; otherwise the softmax temperature.
    top_k: keep the k most likely tokens (0: all).
    top_p: nucleus mass to keep (1.0: all).
    rng: PRNG key (default `PRNGKey(0)`); unused when greedy.

  Returns:
    `DecodeOutput` with `[batch, max_decode_len]` sequences and `[batch]` lengths.

  Raises:
    ValueError: before any compilation, naming the bad argument (e.g. a float
      `max_decode_len`, ids outside the vocabulary in `inputs`).
  """
  args = validation.check_scorer_decode_args(
      scorer, inputs, max_decode_len=max_decode_len, eos_id=eos_id, temperature=temperature,
      top_k=top_k, top_p=top_p, rng=rng)
  return baseline.decode(scorer, args.inputs, args.rng, max_decode_len=args.max_decode_len,
                         warp=Warp.of(args), eos_id=args.eos_id)


def speculative_sample(target: Scorer, draft: Draft, inputs: Array, *, gamma: int,
                       max_decode_len: int, eos_id: int, temperature: float = 0.0,
                       top_k: int = 0, top_p: float = 1.0, rng: Array | None = None,
                       draft_inputs: Array | None = None) -> SpeculativeOutput:
  """Samples from `target` with `draft` proposing `gamma` tokens per target call.

  The output is distributed exactly as `sample(target, ...)` with the same temperature /
  top_k / top_p; at temperature 0 it is the same tokens.

  Args:
    target: the target's `decoding.scorer.Scorer`.
    draft: a `decoding.drafts.Draft` with the target's vocabulary (e.g.
      `LayerSkipDraft(model, weights, 8)`, `T5Draft(draft_model, draft_params)`).
    inputs: int32 `[batch, input_len]`, 0-padded: what `target.encode` takes.
    gamma: proposals per target call (>= 1); `timing.choose_gamma` picks one.
    max_decode_len: the most tokens to generate per row.
    eos_id: the end-of-sequence id.
    temperature: 0 for greedy; otherwise the softmax temperature.
    top_k: keep the k most likely tokens (0: all).
    top_p: nucleus mass to keep (1.0: all).
    rng: PRNG key (default `PRNGKey(0)`).
    draft_inputs: int32 `[batch, draft_input_len]`, the draft's own inputs if they differ
      (default `inputs`), one row per row of `inputs`.

  Returns:
    A `SpeculativeOutput`: sequences, lengths and the acceptance statistics.

  Raises:
    ValueError: before any compilation, naming the bad argument (e.g. `gamma=0`, a draft
      of another vocabulary, `draft_inputs` of another batch size).
  """
  args = validation.check_scorer_speculative_args(
      target, draft, inputs, gamma=gamma, draft_inputs=draft_inputs,
      max_decode_len=max_decode_len, eos_id=eos_id, temperature=temperature, top_k=top_k,
      top_p=top_p, rng=rng)
  return speculative.speculative_decode(
      target, draft, args.inputs, args.rng, gamma=args.gamma,
      max_decode_len=args.max_decode_len, warp=Warp.of(args), eos_id=args.eos_id,
      draft_inputs=args.draft_inputs)
