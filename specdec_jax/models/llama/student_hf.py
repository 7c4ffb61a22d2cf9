"""A trained `Student` draft as a transformers Llama model, for the peer's assisted generation.

transformers' `generate(..., assistant_model=...)` takes any causal LM with the target's
vocabulary. The draft becomes a `LlamaForCausalLM` of its own width and depth: its
embedding is the projected target table `E W_in` (`[vocab, d_model]`, computed once),
its blocks are its own (kernels transposed into torch's `[out, in]`; RoPE, RMSNorm and
SwiGLU as transformers' Llama computes them), and its output layer is `ShortlistHead`:
the logits of the shortlist `h (E[shortlist] W_out)^T + bias` scattered into the full
vocabulary, -inf elsewhere, as `LlamaWeights.head_tokens` does in our decoder. Needs
torch and transformers (the `peer` / `test` extras).
"""

from __future__ import annotations

import numpy as np
import torch
import transformers

from specdec_jax.models.llama.student import Student, StudentConfig


class ShortlistHead(torch.nn.Module):
  """Logits over the whole vocabulary from a shortlist's: -inf outside it."""

  def __init__(self, weight: np.ndarray, bias: np.ndarray, head_tokens: np.ndarray,
               vocab_size: int):
    """Args: weight float `[head, d_model]`, bias `[head]`, head_tokens int `[head]`."""
    super().__init__()
    self.weight = torch.nn.Parameter(torch.from_numpy(np.asarray(weight, np.float32)),
                                     requires_grad=False)
    self.bias = torch.nn.Parameter(torch.from_numpy(np.asarray(bias, np.float32)),
                                   requires_grad=False)
    self.register_buffer("head_tokens", torch.from_numpy(np.asarray(head_tokens, np.int64)))
    self.vocab_size = vocab_size

  def forward(self, hidden: torch.Tensor) -> torch.Tensor:
    """`[..., d_model]` -> `[..., vocab]`."""
    scores = torch.nn.functional.linear(hidden, self.weight.to(hidden.dtype),
                                        self.bias.to(hidden.dtype))
    logits = hidden.new_full(hidden.shape[:-1] + (self.vocab_size,), float("-inf"))
    return logits.index_copy(-1, self.head_tokens, scores)


def check_exportable(config: StudentConfig) -> None:
  """Refuses a draft that transformers' assisted generation cannot run.

  Raises:
    ValueError: the draft reads its target's features (`config.feature_size`),
      which transformers' assistant interface cannot hand it.
  """
  if config.feature_size:
    raise ValueError(f"This draft reads its target's features (feature_size="
                     f"{config.feature_size}); a transformers Llama assistant sees only tokens. "
                     "Export a token-only draft (feature_size 0), such as draft_smollm2.")


def to_transformers(config: StudentConfig, params: dict, embedding: np.ndarray,
                    head_tokens: np.ndarray) -> transformers.LlamaForCausalLM:
  """The draft as a float32 `LlamaForCausalLM` in eval mode.

  Args:
    config: the draft's config.
    params: its parameters (`student_io.load_student`'s, float32).
    embedding: `[vocab, embed_dim]`, the target's token embedding.
    head_tokens: int `[head]`, its shortlist.

  Raises:
    ValueError: from `check_exportable`.
  """
  check_exportable(config)
  blocks = config.blocks
  hf_config = transformers.LlamaConfig(
      vocab_size=blocks.vocab_size, hidden_size=blocks.d_model,
      intermediate_size=blocks.d_ff, num_hidden_layers=blocks.num_layers,
      num_attention_heads=blocks.num_heads, num_key_value_heads=blocks.num_kv_heads,
      head_dim=blocks.head_dim, rope_theta=blocks.rope_theta,
      rms_norm_eps=blocks.layer_norm_epsilon, tie_word_embeddings=False,
      bos_token_id=blocks.bos_token_id, eos_token_id=blocks.eos_token_id,
      pad_token_id=blocks.pad_token_id, max_position_embeddings=8192)
  model = transformers.LlamaForCausalLM(hf_config)
  table, head = (np.asarray(x, np.float32) for x in Student(config).io_matrices(
      params, embedding, head_tokens))                  # [vocab, d_model], [head, d_model]

  def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(x, np.float32))  # A writable copy.

  state = {"model.embed_tokens.weight": t(table),
           "model.norm.weight": t(params["decoder"]["decoder_norm"]["scale"])}
  names = {"attention/query": "self_attn.q_proj", "attention/key": "self_attn.k_proj",
           "attention/value": "self_attn.v_proj", "attention/out": "self_attn.o_proj",
           "mlp/wi_0": "mlp.gate_proj", "mlp/wi_1": "mlp.up_proj", "mlp/wo": "mlp.down_proj"}
  for i in range(blocks.num_layers):
    layer = params["decoder"][f"layers_{i}"]
    prefix = f"model.layers.{i}."
    for ours, theirs in names.items():
      group, name = ours.split("/")
      state[prefix + theirs + ".weight"] = t(layer[group][name]["kernel"].T)
    state[prefix + "input_layernorm.weight"] = t(layer["pre_attention_layer_norm"]["scale"])
    state[prefix + "post_attention_layernorm.weight"] = t(layer["pre_mlp_layer_norm"]["scale"])
  missing, unexpected = model.load_state_dict(state, strict=False)
  if unexpected or set(missing) != {"lm_head.weight"}:
    raise ValueError(f"internal: the draft's tensors do not map onto transformers' Llama "
                     f"(missing {missing}, unexpected {unexpected}).")
  model.lm_head = ShortlistHead(head, params["logits_bias"], head_tokens, blocks.vocab_size)
  return model.eval()
