"""Parity with the reference implementation (HuggingFace `T5ForConditionalGeneration`).

Our random parameters go through `save_hf_checkpoint` into the PyTorch model;
both then see the same inputs, including a padded row, and must agree on
encoder outputs, logits (full-sequence and chunked-cached) and greedy tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import make_model
from transformers import T5ForConditionalGeneration

from specdec_jax.models.t5 import T5Model, temperature_sample
from specdec_jax.models.t5.checkpoints import (
  load_hf_checkpoint,
  parameter_names,
  save_hf_checkpoint,
)

ATOL = 1e-4
GEN_LEN = 40
GEN_SEED = 4  # Inputs on which both random models' greedy outputs vary most.
# Uneven chunk sizes 1, 5, 1, 5, 1, 1 (two shapes: each new one is a compile).
CHUNKS = ((0, 1), (1, 6), (6, 7), (7, 12), (12, 13), (13, 14))


def _inputs(batch: int = 3, length: int = 9, vocab: int = 97, seed: int = 0) -> np.ndarray:
  """Random encoder tokens in [2, vocab); the last row is 0-padded after its first half."""
  inputs = np.random.RandomState(seed).randint(2, vocab, size=(batch, length))
  inputs[-1, length // 2:] = 0
  return inputs.astype(np.int32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _hf_model(tmp_path_factory, model: T5Model, params: dict) -> T5ForConditionalGeneration:
  path = tmp_path_factory.mktemp("hf") / "ckpt"
  save_hf_checkpoint(str(path), model.config, params)
  return T5ForConditionalGeneration.from_pretrained(str(path)).eval()


def _generation_model(family: str) -> tuple[T5Model, dict]:
  """The family's test model with as many decoder as encoder layers.

  HF's `generate` mishandles its cache when the two stacks differ in depth, so
  the T5.1.1 test model (3 decoder layers) keeps only its first 2; dropping
  layers from the parameter tree avoids initialising a new config.
  """
  model, params = make_model(family)
  cfg = model.config
  if cfg.num_decoder_layers == cfg.num_layers:
    return model, params
  decoder = {k: v for k, v in params["decoder"].items()
             if not k.startswith("layers_") or int(k.split("_")[1]) < cfg.num_layers}
  return T5Model(cfg.replace(num_decoder_layers=cfg.num_layers)), {**params, "decoder": decoder}


@pytest.fixture(scope="module", params=["test-v1_0", "test-v1_1"])
def pair(request, tmp_path_factory):
  """(our model, our params, the HF model built from our checkpoint), per family."""
  model, params = make_model(request.param)
  return model, params, _hf_model(tmp_path_factory, model, params)


def _hf_logits(hf: T5ForConditionalGeneration, inputs: np.ndarray,
               decoder_inputs: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    out = hf(input_ids=torch.from_numpy(inputs).long(),
             attention_mask=torch.from_numpy(inputs != 0).long(),
             decoder_input_ids=torch.from_numpy(decoder_inputs).long())
  return out.logits.numpy()


def _get(tree: dict, path: tuple[str, ...]) -> np.ndarray:
  for key in path:
    tree = tree[key]
  return np.asarray(tree)


def test_our_checkpoint_has_every_hf_parameter(pair):
  model, params, hf = pair
  hf_state = hf.state_dict()
  for ours, hf_name, transposed in parameter_names(model.config):
    value = _get(params, ours)
    np.testing.assert_array_equal(
        hf_state[hf_name].numpy(), value.T if transposed else value, err_msg=hf_name)


def test_hf_save_pretrained_loads_back_identically(pair, tmp_path):
  model, params, hf = pair
  hf.save_pretrained(str(tmp_path))
  cfg, loaded = load_hf_checkpoint(str(tmp_path))
  # The config comes back as it went in (num_decoder_layers explicit, never None).
  assert cfg == model.config
  flat_ours = jax.tree_util.tree_leaves_with_path(params)
  flat_loaded = dict(jax.tree_util.tree_leaves_with_path(loaded))
  assert len(flat_ours) == len(flat_loaded)
  for path, value in flat_ours:
    np.testing.assert_array_equal(flat_loaded[path], np.asarray(value),
                                  err_msg=jax.tree_util.keystr(path))


def test_encoder_outputs_match(pair):
  model, params, hf = pair
  inputs = _inputs()
  ours = np.asarray(model.encoder_outputs(params, jnp.asarray(inputs)))
  with torch.no_grad():
    theirs = hf.encoder(input_ids=torch.from_numpy(inputs).long(),
                        attention_mask=torch.from_numpy(inputs != 0).long()).last_hidden_state
  real = inputs != 0
  np.testing.assert_allclose(ours[real], theirs.numpy()[real], atol=ATOL, rtol=0)
  assert np.abs(ours).max() > 0.1  # Not trivially zero.


def test_full_and_chunked_cached_logits_match(pair):
  model, params, hf = pair
  inputs = _inputs()
  decoder_inputs = np.random.RandomState(1).randint(2, 97, size=(3, 14)).astype(np.int32)
  decoder_inputs[:, 0] = model.config.decoder_start_token_id
  theirs = _hf_logits(hf, inputs, decoder_inputs)

  full = np.asarray(model.logits(params, jnp.asarray(inputs), jnp.asarray(decoder_inputs)))
  np.testing.assert_allclose(full, theirs, atol=ATOL, rtol=0)

  encoded = model.encode(params, jnp.asarray(inputs))
  cache = model.init_cache(3, 16)
  chunked = []
  for start, stop in CHUNKS:
    logits, cache = model.decode_chunk(params, encoded, cache,
                                       jnp.asarray(decoder_inputs[:, start:stop]))
    chunked.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(chunked, axis=1), theirs, atol=ATOL, rtol=0)
  # The rows disagree with each other: the padded row is not a copy of another.
  assert np.abs(theirs[0] - theirs[2]).max() > 0.1


def _hf_greedy(hf: T5ForConditionalGeneration, inputs: np.ndarray, eos_id: int) -> np.ndarray:
  """HF greedy tokens `[batch, GEN_LEN]` without the start token, 0-padded."""
  with torch.no_grad():
    out = hf.generate(input_ids=torch.from_numpy(inputs).long(),
                      attention_mask=torch.from_numpy(inputs != 0).long(), do_sample=False,
                      max_new_tokens=GEN_LEN, eos_token_id=eos_id, pad_token_id=0,
                      decoder_start_token_id=0)
  tokens = out.numpy()[:, 1:]
  return np.pad(tokens, ((0, 0), (0, GEN_LEN - tokens.shape[1])))


def _pick_mid_sequence_eos(sequences: np.ndarray) -> tuple[int, int, int]:
  """(token, row, step): `row` first emits `token` at `step` in 6..20; some row never does."""
  for step in range(6, 21):
    for row, tokens in enumerate(sequences):
      token = int(tokens[step])
      others = np.delete(sequences, row, axis=0)
      if token != 0 and token not in tokens[:step] and not (others == token).any(axis=1).all():
        return token, row, step
  raise AssertionError(f"no token qualifies as a mid-sequence EOS in {sequences}")


@pytest.fixture(scope="module", params=["test-v1_0", "test-v1_1"])
def generation_pair(request, tmp_path_factory):
  """Like `pair`, with equally deep encoder and decoder (see `_generation_model`)."""
  model, params = _generation_model(request.param)
  return model, params, _hf_model(tmp_path_factory, model, params)


def test_greedy_generation_matches_token_for_token(generation_pair):
  """Batch 3 with a padded row; one row stops at an EOS mid-sequence, one runs to the end."""
  model, params, hf = generation_pair
  inputs = _inputs(seed=GEN_SEED)
  # HF's free-running greedy tokens (EOS id 96 is never emitted) choose the EOS.
  free = _hf_greedy(hf, inputs, eos_id=96)
  assert 96 not in free
  assert len(np.unique(free)) >= 12, f"degenerate greedy sequences {free}"
  eos, row, step = _pick_mid_sequence_eos(free)

  out = temperature_sample(model, params, jnp.asarray(inputs), max_decode_len=GEN_LEN,
                           eos_id=eos)
  ours, lengths = np.asarray(out.sequences), np.asarray(out.lengths)
  theirs = _hf_greedy(hf, inputs, eos_id=eos)
  np.testing.assert_array_equal(ours, theirs)
  assert lengths[row] == step + 1 and ours[row, step] == eos and not ours[row, step + 1:].any()
  assert lengths.max() == GEN_LEN
  full = lengths == GEN_LEN
  np.testing.assert_array_equal(ours[full], free[full])
  for b in range(3):
    np.testing.assert_array_equal(ours[b, :lengths[b]], free[b, :lengths[b]])
    assert not ours[b, lengths[b]:].any()
