"""Training from stored signals end to end: a tiny target makes the signals of a tiny
distillation directory, the driver trains a shared-encoder draft on them with no target
in the step, measures alpha during training, keeps the best parameters by alpha and
exports them; a restarted run continues the curve; the curves are gathered and drawn."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from specdec_jax import atomic_io
from specdec_jax.data import corpora, distill, layout
from specdec_jax.distillation import signals
from specdec_jax.distillation.teacher import teacher_sha256
from specdec_jax.draft_pricing import t5_runs
from specdec_jax.experiment import alpha_curves, figures
from specdec_jax.models.layers import ParamInfo
from specdec_jax.models.t5 import T5Model, get_config
from specdec_jax.models.t5.checkpoints import load_model, save_hf_checkpoint
from specdec_jax.training import alpha_tracking, trainer
from specdec_jax.training.model_config import model_config
from specdec_jax.training.optimizer import LearningRate, Optimizer
from specdec_jax.training.train_t5 import TrainConfig, train
from specdec_jax.training.trainer import LossConfig

# The module-scoped fixtures run once: every test of this file on one worker.
pytestmark = pytest.mark.xdist_group("train_signals")

VOCAB = 8192  # The SentencePiece vocabulary the held-out inputs are tokenised with.
INPUTS_LENGTH, MAX_DECODE_LEN, DECODINGS = 32, 6, 2
SOURCES = ["Choose Tools - Options.", "Resize the overview.", "Press Ctrl + F.",
           "Inserts a new row above the current row in the table.", "Click OK.",
           "Opens the Styles deck."]
STUDENT = {"d_model": 16, "num_heads": 2, "d_kv": 8, "d_ff": 32, "num_layers": 1,
           "num_decoder_layers": 1, "dropout_rate": 0.0, "vocab_size": VOCAB}


def _write_teacher(path: str, seed: int = 0) -> None:
  """A tiny random T5 over the vocabulary (the declared shapes filled here: no
  initialiser to compile)."""
  model = T5Model(get_config("test-v1_1", vocab_size=VOCAB))
  rng = np.random.default_rng(seed)

  def fill(where, info: ParamInfo) -> np.ndarray:
    if "scale" in jax.tree_util.keystr(where):
      return np.ones(info.shape, np.float32)
    return (rng.standard_normal(info.shape) / np.sqrt(info.shape[0])).astype(np.float32)

  save_hf_checkpoint(path, model.config, jax.tree_util.tree_map_with_path(
      fill, model.param_info(), is_leaf=lambda x: isinstance(x, ParamInfo)))


def _write_corpora(data_dir: str) -> None:
  """Every split of both corpora (the held-out inputs are the validation split's)."""
  for corpus in layout.CORPORA:
    for split in layout.SPLITS:
      rows = [corpora.Example(f"{corpus}{i}", text, "x", f"page{i}")
              for i, text in enumerate(SOURCES)]
      corpora.write_jsonl(layout.corpus_file(data_dir, corpus, split), rows)


def _write_distill(data_dir: str, corpus: str, teacher_sha: str, seed: int) -> None:
  """A complete distillation directory of random outputs, in 2 shards of 4 rows."""
  rng = np.random.default_rng(seed)
  n, shard_size = 8, 4
  in_len = np.sort(rng.integers(4, 17, n)).astype(np.int32)  # One bucket: one program.
  out_len = rng.integers(2, MAX_DECODE_LEN + 1, (n, DECODINGS)).astype(np.int32)
  inputs = np.zeros((n, INPUTS_LENGTH), np.int32)
  outputs = np.zeros((n, DECODINGS, MAX_DECODE_LEN), np.int32)
  for i in range(n):
    inputs[i, :in_len[i]] = np.append(rng.integers(2, VOCAB, in_len[i] - 1), 1)
    for d in range(DECODINGS):
      outputs[i, d, :out_len[i, d]] = np.append(rng.integers(2, VOCAB, out_len[i, d] - 1), 1)
  rows = {"ids": np.array([f"row{i}" for i in range(n)]), "index": np.arange(n),
          "inputs": inputs, "input_lengths": in_len, "outputs": outputs,
          "output_lengths": out_len, "truncated": np.zeros((n, DECODINGS), bool)}
  directory = distill.task_dir(distill.distill_root(data_dir), corpus)
  entries = []
  for shard, start in enumerate(range(0, n, shard_size)):
    data = distill.shard_bytes({k: v[start:start + shard_size] for k, v in rows.items()})
    atomic_io.atomic_write_bytes(os.path.join(directory, distill.shard_name(shard)), data)
    entries.append({"shard": shard, "file": distill.shard_name(shard), "start": start,
                    "stop": start + shard_size, "count": shard_size, "decodings": DECODINGS,
                    "sha256": distill.sha256_bytes(data)})
  distill.write_manifest(directory, {
      "format": distill.FORMAT, "corpus": corpus,
      "settings": {"teacher_sha256": teacher_sha, "inputs_length": INPUTS_LENGTH,
                   "max_decode_len": MAX_DECODE_LEN, "temperatures": [0.0, 1.0]},
      "num_examples": n, "num_shards": len(entries), "shards": entries, "complete": True})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """(teacher dir, data dir with distillation data and its signals)."""
  root = tmp_path_factory.mktemp("train_signals")
  teacher = str(root / "teacher")
  _write_teacher(teacher)
  data_dir = str(root / "data")
  _write_corpora(data_dir)
  sha = teacher_sha256(teacher)
  for seed, corpus in enumerate(layout.CORPORA):
    _write_distill(data_dir, corpus, sha, seed)
  signals.compute_signals(signals.SignalsConfig(teacher=teacher, data_dir=data_dir,
                                                top_k=8, batch_size=4))
  return teacher, data_dir


@pytest.fixture
def run(data, monkeypatch):
  """`run(model_dir, loss=None, **config_fields)`: the driver on the tiny data with a tiny
  draft; `loss` overrides LossConfig's fields."""
  teacher, data_dir = data
  monkeypatch.setenv(layout.DATA_DIR_ENV, data_dir)

  def call(model_dir: str, loss: dict | None = None, **kwargs):
    settings = dict(source="signals", student="shared_encoder", teacher_dir=teacher,
                    batch_size=4, bucket_window=2, inputs_length=INPUTS_LENGTH,
                    targets_length=MAX_DECODE_LEN, log_every=2, val_tasks=(),
                    alpha_every_steps=3, alpha_examples=4, alpha_batch_size=4,
                    alpha_tasks=("ende",), alpha_temperatures=(1.0,))
    return train(model_dir, TrainConfig(**{**settings, **kwargs}),
                 model_cfg=model_config(**STUDENT),
                 loss_cfg=LossConfig(**{"distill_weight": 0.5, **(loss or {})}),
                 learning_rate=LearningRate(warmup_steps=1), optimizer_cfg=Optimizer())

  call.teacher = teacher
  return call


def test_training_from_signals_tracks_alpha_and_exports_the_best(run, tmp_path):
  model_dir = str(tmp_path / "draft")
  assert run(model_dir, total_steps=3)["exported_step"] in (0, 3)
  first = alpha_tracking.read_curve(model_dir)
  assert [e["step"] for e in first["entries"]] == [0, 3]
  # Restarted with a longer budget, the run continues the curve from its checkpoint.
  summary = run(model_dir, passes=1.5)  # 32 pairs, 8 steps a pass: 12 steps.
  curve = alpha_tracking.read_curve(model_dir)
  assert [e["step"] for e in curve["entries"]] == [0, 3, 6, 9, 12]
  assert curve["entries"][:2] == first["entries"]
  assert curve["entries"][-1]["passes"] == 1.5
  walls = [e["wall_time_s"] for e in curve["entries"]]
  assert walls == sorted(walls)
  for entry in curve["entries"]:
    assert set(entry["alpha"]["ende"]) == {"T=1"}
    assert 0.0 < entry["alpha"]["ende"]["T=1"] == entry["score"] <= 1.0
  assert curve["entries"][-1]["train"]["loss"] > 0
  best = max(curve["entries"], key=lambda e: e["score"])
  assert curve["best"] == {"step": best["step"], "score": best["score"]}
  assert summary["exported_step"] == best["step"] and summary["steps"] == 12
  assert curve["recipe"]["source"] == "signals"
  # hf/ holds the best parameters, in the shared-encoder format.
  exported = load_file(os.path.join(model_dir, "hf", "model.safetensors"))
  kept = load_file(os.path.join(model_dir, alpha_tracking.BEST_DIR, "model.safetensors"))
  assert exported.keys() == kept.keys()
  for name in exported:
    np.testing.assert_array_equal(exported[name], kept[name])
  model, _ = load_model(os.path.join(model_dir, "hf"))
  assert type(model).__name__ == "SharedEncoderModel"
  with open(os.path.join(model_dir, "hf", "config.json")) as f:
    assert json.load(f)["target"]["path"]
  # Other measurement settings in the same directory are refused.
  with pytest.raises(ValueError, match="other settings"):
    run(model_dir, total_steps=15, alpha_examples=3)
  # The curves of runs, gathered: JSON and figure.
  curves = alpha_curves.collect([model_dir])
  assert [p["step"] for p in curves["draft"]["points"]] == [0, 3, 6, 9, 12]
  assert curves["draft"]["best"] == curve["best"]
  figure = alpha_curves.fig_alpha_curves(curves, str(tmp_path / "curves.png"))
  assert os.path.getsize(figure) > 0
  with pytest.raises(ValueError, match="two runs called 'draft'"):
    alpha_curves.collect([model_dir, model_dir])


def test_on_policy_training_runs_from_the_stored_inputs(run, tmp_path):
  model_dir = str(tmp_path / "on_policy")
  summary = run(model_dir, source="on_policy", total_steps=3,
                loss={"distill_divergence": "total_variation"})
  assert summary["steps"] == 3
  curve = alpha_tracking.read_curve(model_dir)
  assert [e["step"] for e in curve["entries"]] == [0, 3]
  assert curve["recipe"]["source"] == "on_policy"
  assert curve["recipe"]["distill_divergence"] == "total_variation"
  train_losses = curve["entries"][-1]["train"]
  assert 0 < train_losses["distill_loss"] <= 1  # Total variation.
  # The teacher term alone (and the z-loss): no label term on the student's own samples.
  assert train_losses["loss"] == pytest.approx(
      train_losses["distill_loss"] + trainer.LossConfig().z_loss * train_losses["z_loss"],
      rel=1e-5)
  assert type(load_model(os.path.join(model_dir, "hf"))[0]).__name__ == "SharedEncoderModel"
  # The run, ranked by the cost model from its best alpha and its measured c, beside its
  # best parameters as an exported draft, whose alpha the ranking measures the curve's way.
  best_dir = os.path.join(model_dir, alpha_tracking.BEST_DIR)
  record = t5_runs.rank_runs([model_dir, best_dir], target_dir=run.teacher,
                             examples=2, max_decode_len=MAX_DECODE_LEN, max_gamma=2)
  ranked = record["runs"]["on_policy"]
  best = next(e for e in curve["entries"] if e["step"] == curve["best"]["step"])
  exported = record["runs"][alpha_tracking.BEST_DIR]
  assert exported["recipe"]["draft_dir"] == best_dir
  measured_alike = {k: v for k, v in curve["settings"].items() if k != "select"} | {
      "examples": {"ende": curve["settings"]["examples"]["ende"]}}  # En-De alone.
  assert exported["recipe"]["alpha_settings"] == measured_alike
  assert exported["by_temperature"]["T=1"]["alpha"] == best["alpha"]["ende"]["T=1"]
  with pytest.raises(FileNotFoundError, match="neither a training run"):
    t5_runs.rank_runs([str(tmp_path)], target_dir=run.teacher, examples=2,
                      max_decode_len=MAX_DECODE_LEN, max_gamma=2)
  assert ranked["recipe"]["step"] == best["step"]
  assert set(ranked["by_temperature"]) == {"T=1"}
  by_t = ranked["by_temperature"]["T=1"]
  assert by_t["alpha"] == best["alpha"]["ende"]["T=1"]
  assert by_t["gamma"] in (1, 2) and by_t["gamma_steps_only"] in (1, 2) and by_t["c"] > 0
  assert by_t["speedup_steps_only"] == max(by_t["choice"]["speedup_steps_only"].values())
  assert ranked["mean_speedup_steps_only"] == by_t["speedup_steps_only"]
  # The figure's contours are the same prediction the ranking made.
  ratio = {int(k): v for k, v in record["verify_ratio"].items()}
  assert figures.model_calls_speedup(by_t["alpha"], by_t["c"], ratio) == pytest.approx(
      by_t["speedup_steps_only"])
  figure = figures.fig_draft_tradeoff(record, str(tmp_path / "tradeoff.png"))
  assert os.path.getsize(figure) > 0


def test_bad_settings_fail_before_any_work(run, tmp_path):
  model_dir = str(tmp_path / "bad")
  with pytest.raises(ValueError, match="TrainConfig.source"):
    run(model_dir, source="disk", total_steps=2)
  with pytest.raises(ValueError, match="TrainConfig.passes"):
    run(model_dir, source="pipeline", passes=2.0)
  with pytest.raises(ValueError, match="TrainConfig.student='shared_encoder'"):
    run(model_dir, source="on_policy", student="t5", total_steps=2)
  with pytest.raises(ValueError, match="TrainConfig.total_steps"):
    run(model_dir)
  with pytest.raises(ValueError, match="alpha_select_task"):
    run(model_dir, total_steps=2, alpha_select_task="mansum")
  other = str(tmp_path / "other_target")
  _write_teacher(other, seed=1)
  with pytest.raises(ValueError, match="signals of another target"):
    run(model_dir, total_steps=2, teacher_dir=other)
  with pytest.raises(ValueError, match="distill_temperature"):
    run(model_dir, total_steps=2, alpha_every_steps=0, loss={"distill_temperature": 2.0})
