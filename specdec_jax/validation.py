"""Argument checks of the public entry points, in one place, done before any work.

The decoders' entry points (`decoding.generate.sample` / `speculative_sample` for a
scorer of any family, `models.t5.temperature_sample` / `speculative_sample`, data
parallel or not, and `timing.choose_gamma`: one set, `check_scorer_decode_args` and
`check_scorer_speculative_args`), the drafts' constructors, the checkpoint readers,
`specdec_jax.experiment.settings.validate` and the experiment commands check their
arguments with these functions before anything is loaded or compiled. Every
failure is a `ValueError` whose message names the argument, what it got and
what to pass instead.

Rules:
  * Integers: Python and NumPy integers, returned as `int`. `bool`, floats
    (2.5, and 3.0 too), strings and arrays are rejected, never truncated:
    settings such as `gamma` or `max_decode_len` fix the compiled program, so
    they are host scalars, not (possibly traced) JAX arrays.
  * Reals: Python and NumPy reals (integers included), not `bool`, finite.
  * Token ids (`inputs`, `draft_inputs`): an integer array (float and bool
    arrays are rejected, not truncated) of shape `[batch, length]`, both >= 1,
    every id in `[0, vocab_size)`.

Token ids, concrete and traced. Concrete ids (NumPy arrays, nested lists, JAX
arrays, sharded ones included) are checked on the host before compilation; an
id outside the vocabulary raises ValueError naming the argument, the id, its
position and the vocabulary size. Under a trace (a decoder called inside
`jax.jit` or `shard_map`, as the data-parallel decoders do) the ids are not
known until run time, so the compiled program checks them itself before using
them: a `jax.pure_callback` raises that same ValueError on the host (the
position then counts within the traced array, e.g. a shard), and JAX raises it
from the call (or, under asynchronous dispatch, where its result is first
read) as that ValueError or as a `jax.errors.JaxRuntimeError` holding its
message, depending on JAX's dispatch path. Either way no output is returned;
ids are never clamped or wrapped. In a multi-process run each process checks
the rows it holds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _describe(value: Any) -> str:
  """`value` for an error message: its repr and type, or an array's shape and dtype."""
  if isinstance(value, jax.core.Tracer):
    return (f"a traced value of shape {value.shape} (a value computed under jax.jit; this "
            "setting fixes the compiled program, so pass a Python number)")
  if isinstance(value, (np.ndarray, jax.Array)):
    return f"an array of shape {value.shape} and dtype {value.dtype}"
  return f"{value!r} ({type(value).__name__})"


def _note(what: str) -> str:
  return f" ({what})" if what else ""


def as_int(name: str, value: Any, *, minimum: int | None = None, what: str = "") -> int:
  """`value` as an `int`: a Python or NumPy integer (not bool), at least `minimum`.

  Args:
    name: the argument's name, for the message.
    value: what the caller passed.
    minimum: the smallest value allowed (None: any).
    what: a few words on its meaning, for the message.

  Raises:
    ValueError: `value` is not an integer (2.5, 3.0, True, "3", an array) or
      is below `minimum`.
  """
  bound = "" if minimum is None else f" >= {minimum}"
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError(f"{name} must be an int{bound}{_note(what)}, got {_describe(value)}; "
                     "it is not rounded or truncated.")
  if minimum is not None and value < minimum:
    raise ValueError(f"{name} must be an int{bound}{_note(what)}, got {int(value)}.")
  return int(value)


def as_real(name: str, value: Any, *, minimum: float | None = None, what: str = "") -> float:
  """`value` as a finite `float`: a Python or NumPy real (not bool), at least `minimum`.

  Args:
    name: the argument's name, for the message.
    value: what the caller passed.
    minimum: the smallest value allowed (None: any).
    what: a few words on its meaning, for the message.

  Raises:
    ValueError: `value` is not a real number, is NaN or infinite, or is below
      `minimum`.
  """
  bound = "" if minimum is None else f" >= {minimum:g}"
  if (isinstance(value, bool) or not isinstance(value, numbers.Real)
      or not math.isfinite(value) or (minimum is not None and value < minimum)):
    raise ValueError(f"{name} must be a finite float{bound}{_note(what)}, got "
                     f"{_describe(value)}.")
  return float(value)


def check_sampling(temperature: Any, top_k: Any, top_p: Any) -> tuple[float, int, float]:
  """Checks the sampling settings; returns them as (float, int, float).

  `sampling.Warp`'s constructor calls it, so every `Warp` holds checked settings.

  Raises:
    ValueError: temperature < 0, NaN or inf; top_k not an int >= 0; top_p
      outside (0, 1]; any of them bool, a string or an array.
  """
  temperature = as_real("temperature", temperature, minimum=0.0, what="0 = greedy")
  top_k = as_int("top_k", top_k, minimum=0, what="0 = off")
  if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
    raise ValueError(f"top_p must be a float in (0, 1] (1.0 = off), got {_describe(top_p)}.")
  return temperature, top_k, float(top_p)


@functools.cache
def _raw_key_shape() -> tuple[int, ...]:
  """The shape of a raw key of the default PRNG implementation ((2,) for threefry)."""
  return jax.eval_shape(jax.random.PRNGKey, 0).shape


def check_rng(rng: Any) -> Array:
  """One PRNG key: `rng`, or `PRNGKey(0)` if None.

  Raises:
    ValueError: `rng` is not a single key (`jax.random.key(s)` or the raw
      uint32 `jax.random.PRNGKey(s)`), e.g. an int seed or a batch of keys.
  """
  if rng is None:
    return jax.random.PRNGKey(0)
  if isinstance(rng, (np.ndarray, jax.Array)):
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) and rng.ndim == 0:
      return rng
    if rng.dtype == np.uint32 and rng.shape == _raw_key_shape():
      return jnp.asarray(rng)
  raise ValueError(f"rng must be one PRNG key, e.g. jax.random.PRNGKey(0) or "
                   f"jax.random.key(0), got {_describe(rng)}; for a seed s pass "
                   "jax.random.PRNGKey(s).")


def check_token_ids(name: str, ids: Any, vocab_size: int) -> Array:
  """Checks `[batch, length]` token ids against a vocabulary; returns them as int32.

  Concrete ids are checked on the host now; traced ids by the compiled program
  at run time (see the module docstring).

  Args:
    name: the argument's name ("inputs", "draft_inputs"), for the message.
    ids: an integer array-like `[batch, length]`.
    vocab_size: ids must lie in `[0, vocab_size)`.

  Returns:
    The ids as an int32 JAX array (sharding kept).

  Raises:
    ValueError: not a rectangular 2-D array with both sizes >= 1, not of an
      integer dtype, or (concrete ids) an id outside the vocabulary.
  """
  if not isinstance(ids, (np.ndarray, jax.Array)):
    try:
      ids = np.asarray(ids)
    except ValueError as e:
      raise ValueError(f"{name} must be a [batch, input_len] array of token ids; {e}") from e
  if ids.ndim != 2 or 0 in ids.shape:
    raise ValueError(f"{name} must be [batch, input_len] int tokens with batch >= 1 and "
                     f"input_len >= 1, got shape {ids.shape}.")
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}; ids are not "
                     "truncated: pass the tokenizer's output as integers (e.g. np.int32).")
  if isinstance(ids, jax.core.Tracer):
    ids = _check_ids_at_run_time(name, ids, vocab_size)
  else:
    for (row0, col0), block in _host_blocks(ids):
      bad = (block < 0) | (block >= vocab_size)
      if bad.any():
        row, col = np.argwhere(bad)[0]
        raise _id_error(name, int(block[row, col]), (row0 + int(row), col0 + int(col)),
                        vocab_size, int(bad.sum()))
  return jnp.asarray(ids, jnp.int32)


def _host_blocks(ids: np.ndarray | Array) -> Iterator[tuple[tuple[int, int], np.ndarray]]:
  """(offset, values) of each distinct block of `ids` this process holds."""
  if not isinstance(ids, jax.Array):
    yield (0, 0), ids
    return
  seen = set()
  for shard in ids.addressable_shards:
    offset = tuple(s.start or 0 for s in shard.index)
    if offset not in seen:
      seen.add(offset)
      yield offset, np.asarray(shard.data)


def _id_error(name: str, token: int, position: tuple[int, int], vocab_size: int,
              count: int) -> ValueError:
  return ValueError(
      f"{name} holds token id {token} at [{position[0]}, {position[1]}] ({count} id(s) in all "
      f"outside the vocabulary [0, {vocab_size})); the model has {vocab_size} tokens. Were the "
      "inputs tokenized with another vocabulary? Use the model's own SentencePiece model "
      "(spiece.model beside its config.json).")


def _check_ids_at_run_time(name: str, ids: Array, vocab_size: int) -> Array:
  """Traced `ids`, made to depend on a host check that raises if any is out of range.

  The check is a `jax.pure_callback` whose result (0) is added to the ids, so
  nothing computed from them runs before it, and it cannot be pruned.
  """
  flat = ids.reshape(-1)
  bad = (flat < 0) | (flat >= vocab_size)
  first = jnp.argmax(bad)
  report = functools.partial(_raise_if_bad, name, vocab_size, ids.shape[1], ids.dtype)
  zero = jax.pure_callback(report, jax.ShapeDtypeStruct((), ids.dtype), jnp.any(bad), first,
                           flat[first], jnp.sum(bad, dtype=jnp.int32), vmap_method="sequential")
  return ids + zero


def _raise_if_bad(name: str, vocab_size: int, width: int, dtype: np.dtype, any_bad: Array,
                  first: Array, token: Array, count: Array) -> np.ndarray:
  """The host side of `_check_ids_at_run_time`: raises, or returns a 0 of `dtype`."""
  if any_bad:
    # Under a trace, the position is within the traced array (a shard's rows in shard_map).
    raise _id_error(name, int(token), divmod(int(first), width), vocab_size, int(count))
  return np.zeros((), dtype)


def check_model(model: Any, name: str, config_type: type | None = None) -> Any:
  """Checks that `model` is a model of any architecture: its `config` a `config_type`.

  Args:
    model: the model (`T5Model`, `models.llama.LlamaModel`, ...).
    name: the argument's name, for the message ("model", "target").
    config_type: the config class the caller needs (None: any config that
      `check_model_config` accepts; the T5 entry points ask for `T5Config`:
      `models.t5.scorer.check_t5_model`).

  Returns:
    Its config, checked by `check_model_config`.

  Raises:
    ValueError: `model` is no model (e.g. its params), one of another
      architecture than `config_type`'s, or its config is bad.
  """
  config = getattr(model, "config", None)
  if config is None or (config_type is not None and not isinstance(config, config_type)):
    wanted = "a model config" if config_type is None else f"a {config_type.__name__}"
    raise ValueError(f"{name} must be a model whose config is {wanted} (e.g. "
                     "specdec_jax.models.t5.T5Model, whose config is a T5Config; its params are a "
                     f"separate argument), got {type(model).__name__}.")
  return check_model_config(model.config, f"{name}.config")


# The special token ids a model config may hold; each one it has must be in its vocabulary.
SPECIAL_TOKEN_FIELDS = ("pad_token_id", "eos_token_id", "decoder_start_token_id", "bos_token_id")


def check_model_config(config: Any, name: str) -> Any:
  """Checks a model config of any architecture: its special token ids are in its vocabulary.

  Args:
    config: the model's config (`T5Config`, `LlamaConfig`, ...): an int
      `vocab_size` >= 1 and any of `SPECIAL_TOKEN_FIELDS`.
    name: how the message calls it, e.g. "the target's config".

  Returns:
    `config`.

  Raises:
    ValueError: no int `vocab_size` >= 1, or a special token id (pad, EOS,
      decoder start, BOS) outside `[0, vocab_size)` (such an id would embed
      garbage without an error).
  """
  vocab_size = getattr(config, "vocab_size", None)
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
    raise ValueError(f"{name} must be a model config with an int vocab_size >= 1 (e.g. a "
                     f"specdec_jax.models.t5.T5Config), got {_describe(config)}.")
  for field in SPECIAL_TOKEN_FIELDS:
    token = getattr(config, field, None)
    if token is not None and not 0 <= token < vocab_size:
      raise ValueError(f"{name} has {field}={token}, outside its vocabulary "
                       f"[0, {vocab_size}); fix it (config.json or the config).")
  return config


@dataclasses.dataclass(frozen=True)
class DecodeArgs:
  """The checked arguments of one decoder call, normalised.

  Attributes:
    inputs: int32 `[batch, input_len]` encoder tokens, every id in the vocabulary.
    max_decode_len: the most tokens to generate per row (>= 1).
    eos_id: the end-of-sequence id, in the vocabulary.
    temperature: >= 0, finite.
    top_k: >= 0.
    top_p: in (0, 1].
    rng: one PRNG key.

  The decoders turn the three settings into their loop's static
  `sampling.Warp(args.temperature, args.top_k, args.top_p)` (this module stays
  below `decoding`).
  """

  inputs: Array
  max_decode_len: int
  eos_id: int
  temperature: float
  top_k: int
  top_p: float
  rng: Array


def check_scorer_decode_args(scorer: Any, inputs: Any, *, max_decode_len: Any, eos_id: Any,
                             temperature: Any, top_k: Any, top_p: Any, rng: Any,
                             name: str = "scorer") -> DecodeArgs:
  """Checks the arguments every decoder takes, for a scorer of any family.

  Args:
    scorer: the (target) `decoding.scorer.Scorer`: a `T5Scorer`, a `LlamaScorer`, ...
      (its `vocab_size` is what is read).
    inputs: `[batch, input_len]` integer token ids.
    max_decode_len: the most tokens to generate per row.
    eos_id: the end-of-sequence id (a scorer has no config to take it from; the T5
      entry points pass their config's for None).
    temperature: the sampling temperature (0 = greedy).
    top_k: see `sampling.Warp`.
    top_p: see `sampling.Warp`.
    rng: a PRNG key, or None for `PRNGKey(0)`.
    name: the scorer argument's name, for the message ("scorer", "target").

  Returns:
    The normalised `DecodeArgs`.

  Raises:
    ValueError: naming the first bad argument.
  """
  vocab_size = getattr(scorer, "vocab_size", None)
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
    raise ValueError(f"{name} must be a specdec_jax.decoding.scorer.Scorer (e.g. "
                     "T5Scorer(model, params), LlamaScorer(model, weights)), got "
                     f"{type(scorer).__name__}.")
  max_decode_len = as_int("max_decode_len", max_decode_len, minimum=1,
                          what="the most tokens to generate per row")
  eos_id = as_int("eos_id", eos_id)
  if not 0 <= eos_id < vocab_size:
    raise ValueError(f"eos_id={eos_id} is outside the vocabulary [0, {vocab_size}); "
                     "pass the tokenizer's EOS id.")
  temperature, top_k, top_p = check_sampling(temperature, top_k, top_p)
  inputs = check_token_ids("inputs", inputs, vocab_size)
  return DecodeArgs(inputs, max_decode_len, eos_id, temperature, top_k, top_p, check_rng(rng))


@dataclasses.dataclass(frozen=True)
class SpeculativeArgs(DecodeArgs):
  """The checked arguments of one speculative decoder call, normalised.

  Those of `DecodeArgs`, then:

  Attributes:
    gamma: proposals per target call (>= 1).
    draft_inputs: int32 `[batch, draft_input_len]`, the draft's encoder tokens
      (the target's `inputs` unless the caller gave its own).
  """

  gamma: int
  draft_inputs: Array


def check_scorer_speculative_args(target: Any, draft: Any, inputs: Any, *, gamma: Any,
                                  draft_inputs: Any, max_decode_len: Any, eos_id: Any,
                                  temperature: Any, top_k: Any, top_p: Any, rng: Any
                                  ) -> SpeculativeArgs:
  """Checks the arguments every speculative decoder takes, for a target of any family.

  Args:
    target: the target's `decoding.scorer.Scorer` (see `check_scorer_decode_args`); its
      `encoder_width` and `feature_size` are what a draft that reads them must match.
    draft: the `drafts.Draft` (see `check_draft`).
    inputs, max_decode_len, eos_id, temperature, top_k, top_p, rng: as in
      `check_scorer_decode_args`.
    gamma: proposals per target call.
    draft_inputs: the draft's own encoder tokens, or None to share `inputs`.

  Returns:
    The normalised `SpeculativeArgs`.

  Raises:
    ValueError: naming the first bad argument.
  """
  args = check_scorer_decode_args(target, inputs, max_decode_len=max_decode_len, eos_id=eos_id,
                                  temperature=temperature, top_k=top_k, top_p=top_p, rng=rng,
                                  name="target")
  gamma = as_int("gamma", gamma, minimum=1, what="proposals per target call")
  draft_inputs = check_draft(draft, target.vocab_size, args.inputs, draft_inputs,
                             target.encoder_width, target.feature_size)
  return SpeculativeArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args)},
                         gamma=gamma, draft_inputs=draft_inputs)


def check_draft(draft: Any, vocab_size: int, inputs: Array, draft_inputs: Any,
                encoder_width: int | None = None, feature_size: int = 0) -> Array:
  """Checks a speculative draft against the target; returns the draft's inputs.

  Args:
    draft: the `drafts.Draft`.
    vocab_size: the target's vocabulary size.
    inputs: the checked target inputs, int32 `[batch, input_len]`.
    draft_inputs: the draft's own encoder tokens, or None to share `inputs`.
    encoder_width: the width of the target's encoder outputs (a T5's
      d_model), which a draft that reads them must match; None: the target
      has no encoder.
    feature_size: the width of the features the target gives
      (`Scorer.feature_size`; 0: none), which a draft that reads them must match.

  Returns:
    int32 `[batch, draft_input_len]`: `draft_inputs` checked, or `inputs`.

  Raises:
    ValueError: `draft` is not a draft, its vocabulary differs from the
      target's, it reads another target's encoder outputs or features, or
      `draft_inputs` are bad or have another batch size.
  """
  if not all(callable(getattr(draft, m, None)) for m in ("init_state", "propose", "commit")):
    raise ValueError(f"draft must be a specdec_jax.decoding.drafts.Draft, e.g. "
                     f"T5Draft(draft_model, draft_params), got {type(draft).__name__}.")
  if draft.vocab_size != vocab_size:
    raise ValueError(f"The draft's vocabulary ({draft.vocab_size}) differs from the target's "
                     f"({vocab_size}); both must share one vocabulary.")
  width = getattr(getattr(draft, "model", None), "encoder_d_model", None)
  if getattr(draft, "reads_target_encoder", False) and width != encoder_width:
    target = ("has no encoder" if encoder_width is None
              else f"has encoder outputs {encoder_width} wide (its d_model is {encoder_width})")
    raise ValueError(f"The draft reads encoder outputs {width} wide, but the target {target}: "
                     "a shared-encoder draft works only with the target it was trained on (see "
                     "its model card).")
  if getattr(draft, "reads_target_features", False) and draft.feature_size != feature_size:
    target = "gives none" if not feature_size else f"gives them {feature_size} wide"
    raise ValueError(f"The draft reads target features {draft.feature_size} wide, but the "
                     f"target {target}: a feature-reading draft works only with the target it "
                     "was trained on (see its model card).")
  if draft_inputs is None:
    return inputs
  draft_inputs = check_token_ids("draft_inputs", draft_inputs, vocab_size)
  if draft_inputs.shape[0] != inputs.shape[0]:
    raise ValueError(f"draft_inputs has {draft_inputs.shape[0]} rows but inputs has "
                     f"{inputs.shape[0]}; pass the same examples to both (row i of each is "
                     "example i), or None to give the draft `inputs`.")
  return draft_inputs


def check_ngram_order(order: Any) -> int:
  """`order` of an n-gram draft as an int: 1 (unigram) or 2 (bigram)."""
  order = as_int("order", order, what="1 = unigram, 2 = bigram")
  if order not in (1, 2):
    raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order}.")
  return order


def check_ngram_counts(unigram_counts: Any, bigram_prev: Any, bigram_next: Any,
                       bigram_count: Any) -> tuple[np.ndarray, ...]:
  """Checks the token counts an n-gram draft is built from; returns them as arrays.

  Args:
    unigram_counts: `[vocab]` non-negative counts, vocab >= 1.
    bigram_prev: `[N]` integer ids of each bigram's context token, in the vocabulary.
    bigram_next: `[N]` integer ids of its following token, in the vocabulary.
    bigram_count: `[N]` counts >= 0, some > 0 for each context token.

  Raises:
    ValueError: naming the first bad argument.
  """
  arrays = {"unigram_counts": unigram_counts, "bigram_prev": bigram_prev,
            "bigram_next": bigram_next, "bigram_count": bigram_count}
  arrays = {name: np.asarray(value) for name, value in arrays.items()}
  for name, value in arrays.items():
    ids = name in ("bigram_prev", "bigram_next")
    kind = np.integer if ids else np.number
    if value.ndim != 1 or not np.issubdtype(value.dtype, kind):
      raise ValueError(f"{name} must be a 1-D array of {'integer ids' if ids else 'counts'}, "
                       f"got shape {value.shape} and dtype {value.dtype}.")
  vocab = arrays["unigram_counts"].shape[0]
  if vocab < 1 or not np.all(np.isfinite(arrays["unigram_counts"])) or np.any(
      arrays["unigram_counts"] < 0):
    raise ValueError(f"unigram_counts must hold vocab >= 1 finite counts >= 0, got "
                     f"{vocab} counts, min {arrays['unigram_counts'].min(initial=0)}.")
  lengths = {name: value.shape[0] for name, value in arrays.items() if name != "unigram_counts"}
  if len(set(lengths.values())) != 1:
    raise ValueError(f"bigram_prev, bigram_next and bigram_count must have one length (one "
                     f"entry per bigram), got {lengths}.")
  for name in ("bigram_prev", "bigram_next"):
    value = arrays[name]
    bad = (value < 0) | (value >= vocab)
    if bad.any():
      raise ValueError(f"{name} holds token id {value[bad][0]}, outside the vocabulary "
                       f"[0, {vocab}) of unigram_counts; count both with one tokenizer.")
  count = arrays["bigram_count"]
  if not np.all(np.isfinite(count)) or np.any(count < 0):
    raise ValueError(f"bigram_count must hold finite counts >= 0, got min "
                     f"{count.min(initial=0)}.")
  totals = np.bincount(arrays["bigram_prev"].astype(np.intp), weights=count, minlength=vocab)
  unseen = np.setdiff1d(np.unique(arrays["bigram_prev"]), np.nonzero(totals)[0])
  if unseen.size:
    raise ValueError(f"bigram_count is 0 for every bigram after token {unseen[0]}; its "
                     "successor distribution would be 0/0: drop bigrams that were never seen.")
  return tuple(arrays.values())
