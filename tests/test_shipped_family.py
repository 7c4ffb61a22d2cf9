"""The committed model family (assets/models): complete files, size cap, model cards, the
same logits in our model and in the reference implementation, loaded unchanged, and every
draft giving the target's greedy tokens through speculative sampling."""

from __future__ import annotations

import filecmp
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
import torch
from transformers import T5ForConditionalGeneration

from experiments import export_family
from specdec_jax.data import layout, prompts, vocab
from specdec_jax.experiment.targets.family import FAMILY, GGUF_DRAFTS, SHARED_ENCODER
from specdec_jax.models.llama import gguf_loader, student_io
from specdec_jax.models.t5 import (
  T5Model,
  cached_decoder,
  make_draft,
  speculative_sample,
  temperature_sample,
)
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_model

MODELS_DIR = os.path.join(layout.ASSETS_DIR, "models")
SHIPPED = [name for name in FAMILY if os.path.isdir(os.path.join(MODELS_DIR, name))]
SHIPPED_GGUF_DRAFTS = [name for name in GGUF_DRAFTS
                       if os.path.isdir(os.path.join(MODELS_DIR, name))]
HF_FORMAT = [name for name in SHIPPED if name not in SHARED_ENCODER]
FILES = ("README.md", "config.json", "model.safetensors", "spiece.model")


def test_the_family_is_shipped_within_the_size_cap():
  assert "target" in SHIPPED and "draft_small" in SHIPPED, SHIPPED
  assert sorted(os.listdir(MODELS_DIR)) == sorted(SHIPPED + SHIPPED_GGUF_DRAFTS)
  total = export_family.folder_bytes(MODELS_DIR)
  assert total <= export_family.MAX_TOTAL_MB * 1e6, f"{total / 1e6:.1f} MB"


@pytest.mark.parametrize("name", SHIPPED)
def test_member_has_its_files_vocabulary_and_measured_card(name):
  path = os.path.join(MODELS_DIR, name)
  assert sorted(os.listdir(path)) == sorted(FILES)
  assert filecmp.cmp(os.path.join(path, "spiece.model"), vocab.default_vocab_path(),
                     shallow=False)
  with open(os.path.join(path, "README.md"), encoding="utf-8") as f:
    card = f.read()
  quality = (("| test BLEU / ROUGE-L | none",) if name in SHARED_ENCODER
             else ("| test BLEU", "| test ROUGE-L"))
  for row in ("| parameters |", "| training steps |", "| validation loss", *quality):
    assert row in card, row
  if name != "target":
    assert "| task | α (T=0) | α (T=1) |" in card and "Not measured yet" not in card


@pytest.mark.parametrize("name", SHIPPED_GGUF_DRAFTS)
def test_decoder_only_draft_has_its_files_card_and_target(name):
  path = os.path.join(MODELS_DIR, name)
  assert sorted(os.listdir(path)) == sorted(
      ("README.md", student_io.CONFIG, student_io.WEIGHTS))
  saved = student_io.load_student(path)
  assert saved.target.file == gguf_loader.SMOLLM2_FILE.rsplit("/", 1)[-1]
  assert len(np.unique(saved.head_tokens)) == saved.config.head_size
  with open(os.path.join(path, "README.md"), encoding="utf-8") as f:
    card = f.read()
  for row in ("| parameters (own) |", "| shortlist |", "| training |",
              "| held-out alpha (validation outputs) |"):
    assert row in card, row


@pytest.mark.parametrize("name", HF_FORMAT)
def test_member_gives_the_same_logits_in_ours_and_in_transformers(name):
  path = os.path.join(MODELS_DIR, name)
  cfg, params = load_hf_checkpoint(path)
  model = T5Model(cfg)
  processor = spm.SentencePieceProcessor(model_file=os.path.join(path, "spiece.model"))
  pairs, _ = prompts.load_examples("ende", "test", 2)
  inputs = prompts.tokenize(processor, [x for x, _ in pairs], 48)
  targets = prompts.tokenize(processor, [y for _, y in pairs], 16)
  decoder_inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
  ours = np.asarray(model.logits(params, jnp.asarray(inputs), jnp.asarray(decoder_inputs)))
  hf = T5ForConditionalGeneration.from_pretrained(path, torch_dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = hf(input_ids=torch.from_numpy(inputs).long(),
                attention_mask=torch.from_numpy(inputs > 0).long(),
                decoder_input_ids=torch.from_numpy(decoder_inputs).long()).logits.numpy()
  mask = targets > 0
  np.testing.assert_allclose(ours[mask], theirs[mask], atol=2e-3, rtol=1e-3)
  # The trained model predicts the references far better than chance.
  assert (ours[mask].argmax(-1) == targets[mask]).mean() > 0.2


@pytest.fixture(scope="module")
def target_and_prompts():
  cfg, params = load_hf_checkpoint(os.path.join(MODELS_DIR, "target"))
  processor = spm.SentencePieceProcessor(model_file=vocab.default_vocab_path())
  pairs, _ = prompts.load_examples("ende", "test", 2)
  inputs = jnp.asarray(prompts.tokenize(processor, [x for x, _ in pairs], 48))
  target = T5Model(cfg)
  return target, params, inputs, temperature_sample(target, params, inputs, max_decode_len=24)


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "target"])
def test_draft_gives_the_targets_greedy_tokens(name, target_and_prompts):
  target, params, inputs, base = target_and_prompts
  draft = make_draft(*load_model(os.path.join(MODELS_DIR, name)))
  out = speculative_sample(target, params, draft, inputs, gamma=3, max_decode_len=24)
  np.testing.assert_array_equal(out.sequences, base.sequences)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  assert int(np.sum(out.stats.accepted)) > 0  # A trained draft agrees some of the time.


def test_make_draft_prepares_the_shipped_draft_once_in_half_panels():
  # Prepared outside the loop: no packing per generation, half the bytes per proposal.
  model, params = load_model(os.path.join(MODELS_DIR, "draft_shared_enc_signals"))
  params = jax.device_put(params)
  draft = make_draft(model, params)
  assert isinstance(draft.params, cached_decoder.PreparedParams)
  panels = [x for x in jax.tree.leaves(draft.params.decoder) if x.ndim == 3]
  assert len(panels) == (13 if model.options.packs_panels else 0)
  assert all(x.dtype == jnp.float16 for x in panels)
