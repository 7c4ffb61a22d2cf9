"""experiments.export_family: float16 HF folders with model cards, from a training run."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from conftest import make_model

from experiments import export_family
from specdec_jax import atomic_io
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, save_hf_checkpoint


def _fake_run(root: str, name: str) -> dict:
  """A finished training run of a tiny model: `<root>/<name>/{hf,train_summary.json}`."""
  model, params = make_model("test-v1_1", 0)
  params = jax.device_get(params)
  os.makedirs(root, exist_ok=True)
  vocab = os.path.join(root, "spiece.model")
  with open(vocab, "wb") as f:
    f.write(b"not a real vocabulary")
  save_hf_checkpoint(os.path.join(root, name, "hf"), model.config, params,
                     extra_files={"spiece.model": vocab})
  atomic_io.write_json(os.path.join(root, name, "train_summary.json"), {
      "model_config": model.config.to_hf_dict(), "params": 123456, "steps": 10,
      "input_tokens_seen": 1000, "target_tokens_seen": 500, "train_wall_time_s": 36.0,
      "validation_loss": {"specdec_ende": 3.25, "specdec_mansum": 4.5, "all": 3.3},
      "test_bleu_ende": 12.34, "test_rougeL_mansum": 23.45, "test_decode": "greedy",
      "teacher_dir": None, "gin_config": "train.total_steps = 10"})
  return params


def test_export_writes_float16_folders_and_cards(tmp_path):
  params = _fake_run(str(tmp_path / "ckpt"), "draft_small")
  alphas = {"alpha": {"draft_small": {"ende": {"T=0": {"alpha_beta": 0.6543},
                                                "T=1": {"alpha_beta": 0.5}}}},
            "_details": {"estimators": {"alpha_beta": "mean beta"},
                         "settings": {"gamma": 3, "split": "test", "max_decode_len": 64},
                         "examples": {"ende": 7}, "split_examples": {"ende": 7}}}
  out = tmp_path / "models"
  export_family.export_family(str(tmp_path / "ckpt"), str(out), ["target", "draft_small"],
                              alphas, max_total_mb=100.0)
  assert sorted(os.listdir(out)) == ["draft_small"]  # The untrained target is skipped.
  folder = out / "draft_small"
  assert sorted(os.listdir(folder)) == ["README.md", "config.json", "model.safetensors",
                                        "spiece.model"]
  _, loaded = load_hf_checkpoint(str(folder))
  for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(got, np.asarray(want, np.float16).astype(np.float32))
  card = (folder / "README.md").read_text()
  for text in ("0.12M", "12.34", "23.45", "| ende | 0.654 | 0.500 |", "γ = 3",
               "ende: all 7 examples", "train.total_steps = 10"):
    assert text in card, text


def test_export_refuses_a_family_over_the_size_limit(tmp_path):
  _fake_run(str(tmp_path / "ckpt"), "target")
  with pytest.raises(SystemExit, match="max_total_mb"):
    export_family.export_family(str(tmp_path / "ckpt"), str(tmp_path / "m"), ["target"], None,
                                max_total_mb=0.01)
  # Models exported earlier count too: exporting nothing new over a full folder fails.
  export_family.export_family(str(tmp_path / "ckpt"), str(tmp_path / "n"), ["target"], None,
                              max_total_mb=100.0)
  with pytest.raises(SystemExit, match="max_total_mb"):
    export_family.export_family(str(tmp_path / "ckpt"), str(tmp_path / "n"), [], None,
                                max_total_mb=0.01)


def test_card_names_the_exported_step_the_signals_and_what_supersedes_it():
  summary = {
      "model_config": {"d_model": 128, "d_ff": 384, "d_kv": 64, "num_heads": 2,
                       "num_layers": 1, "num_decoder_layers": 2, "vocab_size": 8192},
      "student": "shared_encoder", "init_from": "assets/models/draft_shared_enc",
      "params": 2.79e6, "steps": 6034, "exported_step": 5000,
      "alpha_best": {"score": 0.6223, "step": 5000}, "input_tokens_seen": 10,
      "target_tokens_seen": 5, "train_wall_time_s": 3600.0, "validation_loss": {},
      "teacher_dir": "assets/models/target",
      "loss": {"distill_weight": 0.5, "distill_temperature": 1.0},
      "data": {"source": "signals", "mixture": "specdec_mix"}, "gin_config": ""}
  card = export_family.model_card("draft_shared_enc_long", summary, None)
  assert "| training steps | 6034; exported: step 5000" in card and "0.622" in card
  assert "stored signals" in card and export_family.SUPERSEDED["draft_shared_enc_long"] in card
  assert "Superseded" not in export_family.model_card("draft_shared_enc_signals", summary, None)
