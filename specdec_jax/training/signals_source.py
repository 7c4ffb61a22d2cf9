"""Training batches over the target's stored signals, held in memory.

The distillation data and its signals (`data.teacher_signals.iter_joined`: per shard,
the target's outputs, its encoder outputs and its top-k log-probabilities along them)
are packed once into flat arrays without padding (`PackedSignals`); every (example,
decoding) pair is a row. `SignalsBatches` cuts them into batches the way `batching`
does for the pipeline: each pass (epoch) visits every pair once, in an order shuffled
with `(seed, pass)`; windows of `window` batches are sorted by length and cut into
batches trimmed to the smallest bucket length that holds their longest row, and the
pass's batches are shuffled. A batch is a function of `(seed, step)` alone, so a run
resumed at step s reads the batches the interrupted run would have read.

Batches hold numpy arrays in the layout of `sparse_distill` (`encoder_hidden` only when
the data was packed with it). The last batch of a pass is filled up to `batch_size`
with copies of its own rows whose loss weights are 0, so every batch has the same
number of rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator

import numpy as np

from specdec_jax.data import teacher_signals
from specdec_jax.training import batching

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class PackedSignals:
  """Every example's input and every (example, decoding) pair's signals, unpadded.

  Example e's input tokens are `input_tokens[input_offsets[e]:][:input_lengths[e]]`
  (EOS included), and so are the rows of `hidden`; pair j (of example
  `pair_example[j]`) owns rows `output_offsets[j]:][:output_lengths[j]` of the output
  arrays, one per position of the target's output (EOS included).

  Attributes:
    input_tokens: int32 `[N_in]`.
    input_offsets: int64 `[n]`.
    input_lengths: int32 `[n]`.
    hidden: float16 `[N_in, d]`, the target's encoder outputs (a decoder-only target's
      features along the prompt), or None (not packed).
    pair_example: int64 `[m]`, each pair's example.
    pair_decoding: int32 `[m]`, each pair's decoding (0: the greedy one).
    output_tokens: int32 `[N_out]`, the target's output tokens.
    output_offsets: int64 `[m]`.
    output_lengths: int32 `[m]`.
    topk_ids: int32 `[N_out, k]`, the target's k most probable next tokens.
    topk_logprobs: float16 `[N_out, k]`, their log-probabilities (T=1).
    rest_logprob: float32 `[N_out]`, the log of the mass outside them.
    output_hidden: float16 `[N_out, f]`, a decoder-only target's features along its
      outputs, or None (not packed, or a T5's: f = 0).
  """

  input_tokens: np.ndarray
  input_offsets: np.ndarray
  input_lengths: np.ndarray
  hidden: np.ndarray | None
  pair_example: np.ndarray
  pair_decoding: np.ndarray
  output_tokens: np.ndarray
  output_offsets: np.ndarray
  output_lengths: np.ndarray
  topk_ids: np.ndarray
  topk_logprobs: np.ndarray
  rest_logprob: np.ndarray
  output_hidden: np.ndarray | None = None

  @property
  def num_examples(self) -> int:
    return len(self.input_lengths)

  @property
  def num_pairs(self) -> int:
    return len(self.output_lengths)

  @property
  def top_k(self) -> int:
    return self.topk_ids.shape[1]

  @property
  def hidden_width(self) -> int | None:
    return None if self.hidden is None else self.hidden.shape[1]

  @property
  def nbytes(self) -> int:
    arrays = (getattr(self, f.name) for f in dataclasses.fields(self))
    return sum(a.nbytes for a in arrays if a is not None)

  @classmethod
  def from_shards(cls, shards: Iterable[dict[str, np.ndarray]], *,
                  with_hidden: bool = True) -> PackedSignals:
    """Packs joined shards (`teacher_signals.iter_joined`'s, of one or more corpora).

    Args:
      shards: per shard `inputs [n, >= L_in]`, `input_lengths [n]`, `outputs [n, D,
        >= L_out]`, `output_lengths [n, D]`, `encoder_hidden [n, L_in, d]`, `topk_ids`,
        `topk_logprobs [n, D, L_out, k]` and `rest_logprob [n, D, L_out]`.
      with_hidden: pack `encoder_hidden` (a shared-encoder student reads it) and, where
        the shards hold features along the outputs (`decoder_hidden [n, D, L_out, f]`,
        f > 0), those (a feature-reading student reads both).

    Raises:
      ValueError: no shards, shards of different k or encoder width, or a pair without
        any output token.
    """
    parts: dict[str, list[np.ndarray]] = {f.name: [] for f in dataclasses.fields(cls)}
    n_in = n_out = examples = 0
    for shard in shards:
      in_len = shard["input_lengths"].astype(np.int32)
      out_len = shard["output_lengths"].astype(np.int32)  # [n, D]
      if np.any(out_len < 1):
        raise ValueError("A distillation pair has no output token (output_lengths 0): the "
                         "data is not distill_data's; remake it.")
      l_in, l_out = shard["encoder_hidden"].shape[1], shard["topk_ids"].shape[2]
      in_valid = np.arange(l_in) < in_len[:, None]  # [n, L_in]
      out_valid = np.arange(l_out) < out_len[..., None]  # [n, D, L_out]
      parts["input_tokens"].append(shard["inputs"][:, :l_in][in_valid].astype(np.int32))
      parts["input_offsets"].append(n_in + np.cumsum(in_len, dtype=np.int64) - in_len)
      parts["input_lengths"].append(in_len)
      if with_hidden:
        parts["hidden"].append(shard["encoder_hidden"][in_valid])
      flat_len = out_len.ravel()
      parts["pair_example"].append(np.repeat(np.arange(examples, examples + len(in_len),
                                                       dtype=np.int64), out_len.shape[1]))
      parts["pair_decoding"].append(np.tile(np.arange(out_len.shape[1], dtype=np.int32),
                                            len(in_len)))
      parts["output_tokens"].append(shard["outputs"][..., :l_out][out_valid].astype(np.int32))
      parts["output_offsets"].append(n_out + np.cumsum(flat_len, dtype=np.int64) - flat_len)
      parts["output_lengths"].append(flat_len)
      for name in ("topk_ids", "topk_logprobs", "rest_logprob"):
        parts[name].append(shard[name][out_valid])
      features = shard.get("decoder_hidden")  # Absent or 0 wide: none stored.
      if with_hidden and features is not None and features.shape[-1]:
        parts["output_hidden"].append(features[out_valid])
      n_in += int(in_len.sum())
      n_out += int(flat_len.sum())
      examples += len(in_len)
    if not parts["input_lengths"]:
      raise ValueError("No shards to pack: the signals directories list none; run "
                       "`python -m experiments.teacher_signals` first.")
    if parts["output_hidden"] and len(parts["output_hidden"]) != len(parts["input_lengths"]):
      raise ValueError("Some shards hold the target's features along the outputs and some "
                       "do not: recompute the older ones (python -m "
                       "experiments.teacher_signals).")
    for name, what in (("topk_ids", "top-k sizes"), ("hidden", "encoder widths"),
                       ("output_hidden", "feature widths")):
      widths = {a.shape[1] for a in parts[name]}
      if len(widths) > 1:
        raise ValueError(f"The shards hold {what} {sorted(widths)}: signals of different "
                         "settings cannot be mixed; recompute them with one setting.")
    # One field at a time, each field's parts freed as it is joined: the peak is the parts
    # plus one field, not twice the data (a corpus's features run to gigabytes).
    packed = {}
    for name in list(parts):
      pieces = parts.pop(name)
      packed[name] = np.concatenate(pieces) if pieces else None
    return cls(**packed)


def read_packed(tasks: Iterable[str], *, data_dir: str | None = None, root: str | None = None,
                with_hidden: bool = True, fraction: float = 1.0, seed: int = 0,
                shards: int | None = None) -> PackedSignals:
  """The distillation data and signals of `tasks`, packed.

  Args:
    tasks: tasks (corpora, or a chat model's tasks), e.g. ("ende", "mansum"); their
      pairs are pooled (each pass visits every pair of every task once).
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    root: the distill root; default `<data_dir>/distill`.
    with_hidden: pack the target's encoder outputs.
    fraction: each example (with all its decodings) is kept with this probability,
      drawn once from `seed` (a data-scaling curve); 1 keeps every one.
    seed: seeds that draw.
    shards: read only each task's first `shards` shards, while its signals may still be
      computing (None: every shard, and the task's signals must be complete).

  Raises:
    ValueError: `fraction` outside (0, 1]; `shards` < 1, or more than a task has
      signals for.
    As `teacher_signals.iter_joined` (missing, unfinished or bad data) and
    `PackedSignals.from_shards`.
  """
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must lie in (0, 1], got {fraction}.")
  if shards is not None and shards < 1:
    raise ValueError(f"shards must be at least 1 (or None for every shard), got {shards}.")
  joined = itertools.chain.from_iterable(_first_shards(task, data_dir, root, shards)
                                         for task in tasks)
  if fraction < 1.0:
    joined = _kept(joined, fraction, np.random.default_rng(seed))
  return PackedSignals.from_shards(joined, with_hidden=with_hidden)


def _first_shards(task: str, data_dir: str | None, root: str | None, count: int | None
                  ) -> Iterator[dict[str, np.ndarray]]:
  """`task`'s joined shards: all of a complete corpus, or its first `count` with signals."""
  if count is None:
    yield from teacher_signals.iter_joined(task, data_dir, root=root)
    return
  seen = 0
  for shard in itertools.islice(
      teacher_signals.iter_joined(task, data_dir, root=root, require_complete=False), count):
    seen += 1
    yield shard
  if seen < count:
    raise ValueError(f"{task} has signals for {seen} shards, fewer than the {count} asked "
                     "for: lower the shard count (StudentTrainConfig.train_shards) or let "
                     "`python -m experiments.teacher_signals` compute more (it resumes).")


def _kept(shards: Iterable[dict[str, np.ndarray]], fraction: float, rng: np.random.Generator
          ) -> Iterator[dict[str, np.ndarray]]:
  """Each shard with its examples kept with probability `fraction` (shards are sorted by
  input length, so a prefix would keep only the short prompts)."""
  for shard in shards:
    rows = len(shard["input_lengths"])
    keep = rng.random(rows) < fraction
    yield {name: a[keep] if a.ndim and a.shape[0] == rows else a for name, a in shard.items()}


class SignalsBatches:
  """Length-bucketed, shuffled, resumable batches of (example, decoding) pairs.

  Args:
    data: the packed signals.
    batch_size: rows per batch.
    seed: seeds each pass's order (`np.random.default_rng([seed, pass])`).
    window: batches sorted together by length.
    smallest_bucket: the shortest bucket length (inputs and outputs); buckets double
      up to the data's longest input / output (`batching.bucket_lengths`).
  """

  def __init__(self, data: PackedSignals, *, batch_size: int, seed: int, window: int = 32,
               smallest_bucket: int = 16):
    if batch_size < 1 or window < 1 or smallest_bucket < 1:
      raise ValueError(f"batch_size, window and smallest_bucket must be >= 1, got "
                       f"{batch_size}, {window}, {smallest_bucket}.")
    self.data = data
    self.batch_size = batch_size
    self.seed = seed
    self.window = window
    self._pair_input_lengths = data.input_lengths[data.pair_example]
    self._input_buckets = batching.bucket_lengths(int(data.input_lengths.max()),
                                                  smallest_bucket)
    self._output_buckets = batching.bucket_lengths(int(data.output_lengths.max()),
                                                   smallest_bucket)

  @property
  def steps_per_pass(self) -> int:
    """Batches in one pass over every pair."""
    return math.ceil(self.data.num_pairs / self.batch_size)

  def passes(self, step: int) -> float:
    """Passes over the data completed after `step` batches (fractional)."""
    return step / self.steps_per_pass

  def plan(self, pass_index: int) -> list[np.ndarray]:
    """The pairs of each batch of a pass, in the order they are read: int64 `[<= b]`
    each; every pair is in exactly one."""
    rng = np.random.default_rng([self.seed, pass_index])
    order = rng.permutation(self.data.num_pairs)
    span = self.window * self.batch_size
    batches = []
    for start in range(0, len(order), span):
      chunk = order[start:start + span]
      chunk = chunk[np.lexsort((self.data.output_lengths[chunk],
                                self._pair_input_lengths[chunk]))]
      batches.extend(chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]

  def batch(self, pairs: np.ndarray) -> Batch:
    """The batch of `pairs` (int `[r]`, r <= batch_size), filled up to batch_size.

    Returns:
      `encoder_input_tokens` int32 `[b, Li]`, `encoder_hidden` float16 `[b, Li, d]` (if
      packed), `decoder_hidden` float16 `[b, Lt, f]` (if packed), `decoder_input_tokens`,
      `decoder_target_tokens`, `decoder_loss_weights`
      int32 `[b, Lt]`, `teacher_topk_ids` int32 / `teacher_topk_logprobs` float16
      `[b, Lt, k]` and `teacher_rest_logprob` float32 `[b, Lt]`; Li, Lt bucket lengths;
      zeros past each row's length and in the filler rows' loss weights.
    """
    data, b = self.data, self.batch_size
    if not 1 <= len(pairs) <= b:
      raise ValueError(f"a batch takes 1..{b} pairs, got {len(pairs)}.")
    real = np.arange(b) < len(pairs)
    pairs = np.resize(pairs, b)
    examples = data.pair_example[pairs]
    in_idx, in_valid = _positions(data.input_offsets[examples], data.input_lengths[examples],
                                  self._input_buckets)
    out_idx, out_valid = _positions(data.output_offsets[pairs], data.output_lengths[pairs],
                                    self._output_buckets)
    targets = np.where(out_valid, data.output_tokens[out_idx], 0)
    batch = {
        "encoder_input_tokens": np.where(in_valid, data.input_tokens[in_idx], 0),
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (out_valid & real[:, None]).astype(np.int32),
        "teacher_topk_ids": _masked(data.topk_ids, out_idx, out_valid),
        "teacher_topk_logprobs": _masked(data.topk_logprobs, out_idx, out_valid),
        "teacher_rest_logprob": _masked(data.rest_logprob, out_idx, out_valid),
    }
    if data.hidden is not None:
      batch["encoder_hidden"] = _masked(data.hidden, in_idx, in_valid)
    if data.output_hidden is not None:
      batch["decoder_hidden"] = _masked(data.output_hidden, out_idx, out_valid)
    return batch

  def batches(self, start_step: int = 0) -> Iterator[Batch]:
    """Batch `start_step`, `start_step + 1`, ... (endless: pass after pass)."""
    if start_step < 0:
      raise ValueError(f"start_step must be >= 0, got {start_step}.")
    pass_index, skip = divmod(start_step, self.steps_per_pass)
    while True:
      for pairs in self.plan(pass_index)[skip:]:
        yield self.batch(pairs)
      pass_index, skip = pass_index + 1, 0


def _positions(offsets: np.ndarray, lengths: np.ndarray, buckets: tuple[int, ...]
               ) -> tuple[np.ndarray, np.ndarray]:
  """Flat indices int64 `[b, L]` of rows' positions (0 past a length) and where they
  are valid, bool `[b, L]`; L the smallest bucket holding the longest row."""
  length = next(x for x in buckets if x >= lengths.max())
  positions = np.arange(length)
  valid = positions < lengths[:, None]
  return np.where(valid, offsets[:, None] + positions, 0), valid


def _masked(values: np.ndarray, index: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """`values[index]` `[b, L, ...]` with zeros where not `valid`."""
  out = values[index]
  out[~valid] = 0
  return out
