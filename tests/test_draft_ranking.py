"""Drafts of any family ranked by their predicted speedup (`draft_pricing.draft_ranking`).

The T5 family's trained runs are ranked through it in tests/test_train_signals.py
(`t5_runs.rank_runs`); here a decoder-only Llama target's drafts (a layer-skip draft, a
feature-reading student, prompt lookup) go through the same typed records.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from test_feature_draft import _feature_student
from test_llama import PROMPTS, _random_model

from specdec_jax.decoding import buckets
from specdec_jax.decoding.drafts import PromptLookupDraft
from specdec_jax.draft_pricing.draft_ranking import DraftToRank, rank_drafts
from specdec_jax.experiment import figures
from specdec_jax.models.llama import LayerSkipDraft, LlamaScorer, pad_prompts

MAX_DECODE_LEN = 8
MAX_GAMMA = 2


def test_llama_drafts_are_ranked_through_the_typed_records(tmp_path):
  model, params = _random_model()
  weights = model.prepare(params)
  target = LlamaScorer(model, weights)
  embedding = params["token_embedder"]["embedding"]
  head = jnp.asarray([1, 5, 9, 40, 41, 96], jnp.int32)
  student, student_params = _feature_student(model.config, head)
  alphas = {0.0: 0.7, 1.0: 0.5}
  drafts = [
      DraftToRank("layer_skip_1", LayerSkipDraft(model, weights, 1), alphas, params=0,
                  recipe={"kind": "layer_skip", "layers": 1}),
      DraftToRank("feature_student", student.draft(student_params, embedding, head),
                  {1.0: 0.4}, params=123, model_dir="nowhere"),
      DraftToRank("prompt_lookup", PromptLookupDraft(model.config.vocab_size), {0.0: 0.2},
                  params=0)]
  batches = [buckets.to_bucket(jnp.asarray(pad_prompts(PROMPTS[:2])))]
  ranking = rank_drafts(target, drafts, batches, eos_id=96, max_decode_len=MAX_DECODE_LEN,
                        max_gamma=MAX_GAMMA, timing_calls=2, timing_repeats=1)

  assert [d.name for d in ranking.drafts] == ["layer_skip_1", "feature_student",
                                               "prompt_lookup"]
  assert ranking.batch_size == 2 and ranking.calibration_examples == 2
  assert ranking.draft_gamma == 2 and set(ranking.verify.t_chunk) == {1, 2, 3}
  layer_skip, feature, lookup = ranking.drafts
  assert list(layer_skip.by_temperature) == [0.0, 1.0]  # Each temperature of its alpha.
  assert list(feature.by_temperature) == [1.0] and list(lookup.by_temperature) == [0.0]
  for given, draft in zip(drafts, ranking.drafts, strict=True):
    for t, price in draft.by_temperature.items():
      assert price.alpha == given.alphas[t]
      assert price.c > 0 and price.gamma in (1, 2) and price.gamma_steps_only in (1, 2)
      assert price.speedup_steps_only == max(price.choice.speedup_steps_only.values())
  assert layer_skip.mean_speedup_steps_only == pytest.approx(
      (layer_skip.by_temperature[0.0].speedup_steps_only
       + layer_skip.by_temperature[1.0].speedup_steps_only) / 2)
  ranked = ranking.ranked()
  assert [d.mean_speedup_steps_only for d in ranked] == sorted(
      (d.mean_speedup_steps_only for d in ranking.drafts), reverse=True)

  # The record the T5 ranking writes, and its figure, for these drafts too.
  record = ranking.to_json()
  assert list(record["runs"]) == ["layer_skip_1", "feature_student", "prompt_lookup"]
  run = record["runs"]["layer_skip_1"]
  assert run["recipe"] == {"kind": "layer_skip", "layers": 1} and run["params"] == 0
  assert set(run["by_temperature"]) == {"T=0", "T=1"}
  by_t = run["by_temperature"]["T=1"]
  assert by_t["alpha"] == 0.5 and by_t["choice"]["gamma"] == by_t["gamma"]
  ratio = {int(k): v for k, v in record["verify_ratio"].items()}
  assert figures.model_calls_speedup(by_t["alpha"], by_t["c"], ratio) == pytest.approx(
      by_t["speedup_steps_only"])
  assert record["runs"]["feature_student"]["model_dir"] == "nowhere"


def test_drafts_are_checked_before_any_timing():
  model, params = _random_model()
  target = LlamaScorer(model, model.prepare(params))
  lookup = PromptLookupDraft(model.config.vocab_size)
  batches = [jnp.asarray(pad_prompts(PROMPTS[:1]))]
  with pytest.raises(ValueError, match="repeat"):
    rank_drafts(target, [DraftToRank("a", lookup, {0.0: 0.5}, 0)] * 2, batches, eos_id=96)
  with pytest.raises(ValueError, match=r"\['a'\] have no alpha"):
    rank_drafts(target, [DraftToRank("a", lookup, {}, 0)], batches, eos_id=96)
  with pytest.raises(ValueError, match="0 drafts"):
    rank_drafts(target, [], batches, eos_id=96)
