"""The in-memory batch source over stored signals: packing, every pair once per pass,
determinism, resuming from a step, lengths and loss weights."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_jax.data import teacher_signals
from specdec_jax.training.batching import bucket_lengths
from specdec_jax.training.signals_source import PackedSignals, SignalsBatches, read_packed

D_MODEL, TOP_K, DECODINGS = 6, 3, 2


def synthetic_shard(rng: np.random.Generator, n: int, start: int, *, vocab: int = 97,
                    in_width: int = 40, out_width: int = 20) -> dict[str, np.ndarray]:
  """A joined distillation + signals shard in `teacher_signals.iter_joined`'s layout.

  Values identify where they belong: hidden[e, t] = 1000 e + t + the example's start,
  topk_logprobs[e, d, t] = -(t + 1) / 10 per id.
  """
  in_len = rng.integers(3, in_width, n).astype(np.int32)
  out_len = rng.integers(1, out_width, (n, DECODINGS)).astype(np.int32)
  l_in, l_out = int(in_len.max()), int(out_len.max())
  inputs = np.zeros((n, in_width), np.int32)
  outputs = np.zeros((n, DECODINGS, out_width), np.int32)
  hidden = np.zeros((n, l_in, D_MODEL), np.float16)
  ids = np.zeros((n, DECODINGS, l_out, TOP_K), np.int16)
  logprobs = np.zeros((n, DECODINGS, l_out, TOP_K), np.float16)
  rest = np.zeros((n, DECODINGS, l_out), np.float32)
  for e in range(n):
    inputs[e, :in_len[e]] = np.append(rng.integers(2, vocab, in_len[e] - 1), 1)
    hidden[e, :in_len[e]] = ((start + e) % 50 + np.arange(in_len[e]) / 100)[:, None]
    for d in range(DECODINGS):
      length = out_len[e, d]
      outputs[e, d, :length] = np.append(rng.integers(2, vocab, length - 1), 1)
      ids[e, d, :length] = outputs[e, d, :length, None] + np.arange(TOP_K)
      logprobs[e, d, :length] = -(np.arange(length) + 1)[:, None] / 10
      rest[e, d, :length] = -5.0 - d
  return {"index": np.arange(start, start + n, dtype=np.int64), "inputs": inputs,
          "input_lengths": in_len, "outputs": outputs, "output_lengths": out_len,
          "encoder_hidden": hidden, "topk_ids": ids, "topk_logprobs": logprobs,
          "rest_logprob": rest}


def synthetic_shards(count: int = 3, n: int = 7, seed: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  return [synthetic_shard(rng, n, i * n) for i in range(count)]


@pytest.fixture(scope="module")
def shards():
  return synthetic_shards()


@pytest.fixture(scope="module")
def packed(shards):
  return PackedSignals.from_shards(shards)


def test_packing_keeps_every_token_and_no_padding(shards, packed):
  assert packed.num_examples == 21 and packed.num_pairs == 21 * DECODINGS
  assert len(packed.input_tokens) == sum(int(s["input_lengths"].sum()) for s in shards)
  assert len(packed.output_tokens) == sum(int(s["output_lengths"].sum()) for s in shards)
  assert packed.top_k == TOP_K and packed.hidden_width == D_MODEL
  # Pair 2 * 8 + 1 is example 8 (shard 1, row 1), decoding 1.
  shard, pair = shards[1], 2 * 8 + 1
  length = shard["output_lengths"][1, 1]
  span = slice(packed.output_offsets[pair], packed.output_offsets[pair] + length)
  np.testing.assert_array_equal(packed.output_tokens[span], shard["outputs"][1, 1, :length])
  np.testing.assert_array_equal(packed.topk_ids[span], shard["topk_ids"][1, 1, :length])
  start = packed.input_offsets[8]
  np.testing.assert_array_equal(packed.hidden[start:start + shard["input_lengths"][1]],
                                shard["encoder_hidden"][1, :shard["input_lengths"][1]])
  assert PackedSignals.from_shards(shards, with_hidden=False).hidden is None


def test_a_fraction_keeps_whole_examples_drawn_once_from_the_seed(shards, monkeypatch):
  monkeypatch.setattr(teacher_signals, "iter_joined", lambda task, data_dir, root: shards)
  whole = read_packed(["t"], root="r")
  half = read_packed(["t"], root="r", fraction=0.5, seed=3)
  assert whole.num_examples == 21 and 0 < half.num_examples < 21
  assert half.num_pairs == half.num_examples * DECODINGS  # Every decoding of a kept example.
  again = read_packed(["t"], root="r", fraction=0.5, seed=3)
  np.testing.assert_array_equal(again.output_tokens, half.output_tokens)
  # The kept examples are whole ones of the data: each output is one of the shards'.
  def outputs(data: PackedSignals) -> set[tuple[int, ...]]:
    return {tuple(data.output_tokens[o:o + n])
            for o, n in zip(data.output_offsets, data.output_lengths, strict=True)}

  kept, every = outputs(half), outputs(whole)
  assert kept <= every
  with pytest.raises(ValueError, match="fraction must lie in"):
    read_packed(["t"], root="r", fraction=0.0)


def test_the_first_shards_are_read_while_the_rest_compute(shards, monkeypatch):
  asked = []

  def iter_joined(task, data_dir, root, require_complete=True):
    asked.append(require_complete)
    return iter(shards)

  monkeypatch.setattr(teacher_signals, "iter_joined", iter_joined)
  first = read_packed(["t"], root="r", shards=2)
  assert asked == [False]
  assert first.num_examples == sum(len(s["index"]) for s in shards[:2]) < 21
  np.testing.assert_array_equal(first.output_tokens,
                                PackedSignals.from_shards(shards[:2]).output_tokens)
  with pytest.raises(ValueError, match=f"signals for {len(shards)} shards.*train_shards"):
    read_packed(["t"], root="r", shards=len(shards) + 1)
  with pytest.raises(ValueError, match="shards must be at least 1"):
    read_packed(["t"], root="r", shards=0)


def test_mixed_settings_and_empty_outputs_are_refused(shards):
  other = dict(shards[0], topk_ids=shards[0]["topk_ids"][..., :2])
  with pytest.raises(ValueError, match="top-k sizes"):
    PackedSignals.from_shards([shards[1], other])
  empty = dict(shards[0], output_lengths=np.zeros_like(shards[0]["output_lengths"]))
  with pytest.raises(ValueError, match="output_lengths 0"):
    PackedSignals.from_shards([empty])
  with pytest.raises(ValueError, match="No shards"):
    PackedSignals.from_shards([])


def test_every_pair_once_per_pass_in_another_order_each_pass(packed):
  source = SignalsBatches(packed, batch_size=4, seed=3, window=2)
  assert source.steps_per_pass == 11  # ceil(42 / 4)
  plans = [source.plan(p) for p in range(3)]
  for plan in plans:
    assert len(plan) == source.steps_per_pass
    np.testing.assert_array_equal(np.sort(np.concatenate(plan)), np.arange(42))
  assert not np.array_equal(np.concatenate(plans[0]), np.concatenate(plans[1]))
  again = SignalsBatches(packed, batch_size=4, seed=3, window=2).plan(1)
  assert all(np.array_equal(a, b) for a, b in zip(again, plans[1], strict=True))
  other_seed = SignalsBatches(packed, batch_size=4, seed=4, window=2).plan(1)
  assert not np.array_equal(np.concatenate(other_seed), np.concatenate(plans[1]))
  assert source.passes(22) == 2.0


def test_resuming_at_a_step_yields_the_same_batches(packed):
  source = SignalsBatches(packed, batch_size=4, seed=3, window=2)
  it = source.batches()
  stream = [next(it) for _ in range(30)]  # Into the third pass.
  for start in (5, 11, 17):
    it = SignalsBatches(packed, batch_size=4, seed=3, window=2).batches(start)
    for want in stream[start:start + 8]:
      got = next(it)
      assert got.keys() == want.keys()
      for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_batches_hold_the_pairs_signals_trimmed_to_buckets(shards, packed):
  source = SignalsBatches(packed, batch_size=4, seed=0, window=2, smallest_bucket=8)
  example_rows = [(s, i) for s in shards for i in range(len(s["index"]))]
  for pairs in source.plan(0):
    batch = source.batch(pairs)
    li, lt = batch["encoder_input_tokens"].shape[1], batch["decoder_target_tokens"].shape[1]
    assert li in bucket_lengths(int(packed.input_lengths.max()), 8)
    assert lt in bucket_lengths(int(packed.output_lengths.max()), 8)
    assert batch["encoder_hidden"].shape == (4, li, D_MODEL)
    assert batch["encoder_hidden"].dtype == np.float16
    assert batch["teacher_topk_ids"].shape == (4, lt, TOP_K)
    for row, pair in enumerate(np.resize(pairs, 4)):
      shard, i = example_rows[pair // DECODINGS]
      d = pair % DECODINGS
      n_in, n_out = shard["input_lengths"][i], shard["output_lengths"][i, d]
      np.testing.assert_array_equal(batch["encoder_input_tokens"][row, :n_in],
                                    shard["inputs"][i, :n_in])
      assert not batch["encoder_input_tokens"][row, n_in:].any()
      np.testing.assert_array_equal(batch["encoder_hidden"][row, :n_in],
                                    shard["encoder_hidden"][i, :n_in])
      assert not batch["encoder_hidden"][row, n_in:].any()
      target = batch["decoder_target_tokens"][row]
      np.testing.assert_array_equal(target[:n_out], shard["outputs"][i, d, :n_out])
      assert not target[n_out:].any()
      np.testing.assert_array_equal(batch["decoder_input_tokens"][row],
                                    np.concatenate([[0], target[:-1]]))
      np.testing.assert_array_equal(batch["teacher_topk_logprobs"][row, :n_out],
                                    shard["topk_logprobs"][i, d, :n_out])
      np.testing.assert_array_equal(batch["teacher_rest_logprob"][row, :n_out],
                                    shard["rest_logprob"][i, d, :n_out])
      assert not batch["teacher_topk_ids"][row, n_out:].any()
      filler = row >= len(pairs)
      assert batch["decoder_loss_weights"][row].sum() == (0 if filler else n_out)
