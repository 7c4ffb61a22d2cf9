"""The decoder-only draft's data and training, end to end on a tiny random Llama target.

The distillation commands' library (`distill_data`, `compute_signals`) runs with a
tiny `LlamaTeacher` in place of the GGUF file; `train_student` trains on what they
wrote, estimates alpha on the validation split, resumes, and exports a draft that
loads back and refuses another target.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec_jax.data import layout
from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.sampling import Warp
from specdec_jax.distillation import decode, signals, teacher
from specdec_jax.models.llama import TEST_CONFIG, LlamaModel, LlamaScorer, pad_prompts
from specdec_jax.models.llama.feature_draft import FeatureDraft
from specdec_jax.models.llama.student import Student, student_config
from specdec_jax.models.llama.student_io import TargetId, check_target, load_student
from specdec_jax.training import alpha_tracking, shortlist, student_distill, train_student
from specdec_jax.training import optimizer as optimizers
from specdec_jax.training.sparse_distill import signals_loss_terms
from specdec_jax.training.trainer import LossConfig, TrainState

pytestmark = pytest.mark.xdist_group("train_student")

EOS = 2
SOURCES = {"train": 12, "validation": 4}


class _TinyTeacher(teacher.LlamaTeacher):
  """A `LlamaTeacher` over a tiny random model; its prompts are a few source-derived ids."""

  def __init__(self):  # noqa: D107 (no GGUF file to read)
    model = LlamaModel(TEST_CONFIG.replace(eos_token_id=EOS))
    self.params = model.init_params(jax.random.PRNGKey(0))
    self.path, self.sha256, self.tokenizer_sha256 = "tiny.gguf", "ab" * 32, "ab" * 32
    self.vocab_size, self.eos_id = TEST_CONFIG.vocab_size, EOS
    self.d_model = self.feature_size = TEST_CONFIG.d_model
    self.config = model.config
    self.scorer = LlamaScorer(model, model.prepare(self.params))

  def sources(self, task, split, data_dir):
    self._check_task(task)
    count = SOURCES[split]
    return [f"{task} source {i}" for i in range(count)], list(range(count))

  def tokenize(self, task, texts, width):
    out = np.zeros((len(texts), width), np.int32)
    for i, text in enumerate(texts):
      ids = [3 + (sum(map(ord, text)) * (j + 1)) % 90 for j in range(3 + i % 4)]
      out[i, :len(ids)] = ids
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Distillation data and signals of both splits of two tasks, written by the library."""
  root = tmp_path_factory.mktemp("student")
  tiny = _TinyTeacher()
  data_dir = str(root / "data")
  for split, out in (("train", "distill_tiny"), ("validation", "distill_tiny_validation")):
    config = decode.DistillConfig(
        teacher="tiny.gguf", data_dir=data_dir, output_dir=os.path.join(data_dir, out),
        tasks=("mansum", "explain"), split=split, num_samples=1, inputs_length=16,
        max_decode_len=8, buckets=(8, 16), batch_size=4, shard_size=8)
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(decode, "load_teacher", lambda *a, **k: tiny)
      patch.setattr(decode, "layout", _Layout(data_dir))
      decode.distill_data(config, progress=False)
      patch.setattr(signals, "load_teacher", lambda *a, **k: tiny)
      signals.compute_signals(signals.SignalsConfig(
          teacher="tiny.gguf", data_dir=data_dir, output_dir=config.output_dir, top_k=8,
          batch_size=4))
  return tiny, os.path.join(data_dir, "distill_tiny")


class _Layout:
  """`layout` with corpus files that need not exist (the tiny teacher has its sources)."""

  def __init__(self, data_dir: str):
    self.data_dir = data_dir

  def __getattr__(self, name):
    return getattr(layout, name)

  def corpus_file(self, data_dir, corpus, split):
    path = os.path.join(self.data_dir, "corpora", corpus, f"{split}.jsonl")
    if not os.path.exists(path):
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w", encoding="utf-8") as f:
        for i in range(max(SOURCES.values())):
          f.write(json.dumps({"id": f"{corpus}-{i}", "inputs": "x", "targets": "y",
                              "page": "p"}) + "\n")
    return path


def _config(root: str, **overrides) -> train_student.StudentTrainConfig:
  return dataclasses.replace(train_student.StudentTrainConfig(
      target="tiny.gguf", signals_root=root, d_model=16, num_layers=1, head_dim=8,
      head_size=24, batch_size=4, passes=2.0, eval_every=3, checkpoint_every=4), **overrides)


def _train(model_dir: str, config: train_student.StudentTrainConfig) -> dict:
  """`train_student` with the parts the command builds from the student gin files."""
  return train_student.train_student(
      model_dir, config, learning_rate=optimizers.LearningRate(peak_lr=1e-2, warmup_steps=1),
      optimizer_cfg=optimizers.Optimizer(kind="adamw", weight_decay=0.01),
      loss_cfg=LossConfig(z_loss=0.0, distill_weight=1.0))


def _target(tiny) -> train_student._Target:
  embedding = np.asarray(tiny.params["token_embedder"]["embedding"])
  return train_student._Target(embedding, TargetId(tiny.sha256, 97, embedding.shape[1],
                                                   "tiny.gguf"), EOS, tiny.config, tiny.scorer)


def test_the_target_outputs_and_signals_agree(data):
  """The greedy decodings are the argmax of the stored signals, position by position."""
  from specdec_jax.data import teacher_signals as ts  # noqa: PLC0415
  _, root = data
  shards = list(ts.iter_joined("mansum", root=root))
  for s in shards:
    length = s["topk_ids"].shape[2]
    valid = np.arange(length) < s["output_lengths"][:, 0, None]
    np.testing.assert_array_equal(s["topk_ids"][:, 0, :, 0][valid],
                                  s["outputs"][:, 0, :length][valid])
    # The target's features along the prompts and outputs (what a feature draft reads).
    assert s["encoder_hidden"].shape[2] == s["decoder_hidden"].shape[3] == TEST_CONFIG.d_model
    assert s["decoder_hidden"][:, 0][valid].any(axis=-1).all()


def test_training_resumes_estimates_alpha_and_exports(data, tmp_path, monkeypatch):
  tiny, root = data
  monkeypatch.setattr(train_student, "_load_target", lambda name: _target(tiny))
  model_dir = str(tmp_path / "run")
  config = _config(root)
  first = _train(model_dir, dataclasses.replace(config, passes=1.0))
  assert first["steps"] == first["total_steps"] and first["passes"] == 1.0
  second = _train(model_dir, config)  # Resumes from the checkpoint.
  assert second["steps"] == second["total_steps"] > first["steps"]
  with open(os.path.join(model_dir, train_student.CURVE)) as f:
    curve = json.load(f)
  steps = [p["step"] for p in curve["points"]]
  assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == second["steps"]
  for point in curve["points"]:
    assert 0.0 <= point["alpha_t0"] <= 1.0 and 0.0 <= point["alpha_t1_lower"] <= 1.0
  saved = load_student(os.path.join(model_dir, train_student.EXPORT))
  with open(os.path.join(model_dir, train_student.EXPORT, "README.md")) as f:
    assert "# A decoder-only draft for `tiny.gguf`" in f.read()
  head = np.load(os.path.join(model_dir, train_student.HEAD))
  np.testing.assert_array_equal(saved.head_tokens, head)
  assert EOS in head and saved.config.head_size == 24
  check_target(saved, "run", tiny.sha256, 97, saved.target.embed_dim, "tiny.gguf")
  with pytest.raises(ValueError, match=r"trained for tiny.gguf .* but the target is other.gguf"):
    check_target(saved, "run", "cd" * 32, 97, saved.target.embed_dim, "other.gguf")
  # The last alpha estimate, recomputed from the exported draft by hand.
  student = Student(saved.config)
  embedding = np.asarray(tiny.params["token_embedder"]["embedding"])
  held_out = train_student.read_packed(("mansum", "explain"), root=root + "_validation",
                                       with_hidden=False)
  batches = train_student.SignalsBatches(held_out, batch_size=4, seed=0)
  index = shortlist.shortlist_index(head, 97)
  hits = tokens = 0.0
  for pairs in batches.plan(0):
    batch = shortlist.to_shortlist(batches.batch(pairs), index)
    logits = np.asarray(student_distill.student_logits(student, saved.params, embedding,
                                                       head, batch))
    greedy = (held_out.pair_decoding[np.resize(pairs, 4)] == 0)[:, None]
    weights = batch["decoder_loss_weights"] * greedy
    hits += float(((logits.argmax(-1) == batch["teacher_topk_ids"][..., 0]) * weights).sum())
    tokens += float(weights.sum())
  estimate = train_student._estimate_alpha(student_distill.make_eval_step(student),
                                          saved.params, held_out, batches, index, embedding,
                                          head)
  assert tokens > 0 and estimate["alpha_t0"] == pytest.approx(hits / tokens, abs=1e-6)
  # The export is float16: its estimate is close to the run's last one.
  assert abs(estimate["alpha_t0"] - curve["points"][-1]["alpha_t0"]) < 0.1
  # The same estimate through `teacher_forced_alpha`, beside the training pairs' own.
  both = train_student.teacher_forced_alpha(os.path.join(model_dir, train_student.EXPORT),
                                            config)
  assert both["validation"]["alpha_t0"] == pytest.approx(estimate["alpha_t0"], abs=1e-6)
  assert both["validation"]["pairs"] == held_out.num_pairs
  assert both["train"]["pairs"] == second["train_pairs"]
  assert 0.0 <= both["train"]["alpha_t0"] <= 1.0


def test_a_feature_reading_draft_trains_on_the_stored_features_and_exports(data, tmp_path,
                                                                           monkeypatch):
  """`reads_features`: the packed batches carry the features, the feature loss falls, and
  the export builds a `FeatureDraft` whose greedy tokens through the loop are the
  target's."""
  tiny, root = data
  monkeypatch.setattr(train_student, "_load_target", lambda name: _target(tiny))
  model_dir = str(tmp_path / "features")
  summary = _train(model_dir, _config(root, reads_features=True,
                                                           passes=4.0))
  assert summary["steps"] == summary["total_steps"]
  saved = load_student(os.path.join(model_dir, train_student.EXPORT))
  assert saved.config.feature_size == TEST_CONFIG.d_model
  with open(os.path.join(model_dir, train_student.CURVE)) as f:
    last = json.load(f)["points"][-1]
  with open(os.path.join(model_dir, train_student.EXPORT, "README.md")) as f:
    assert (f"| held-out alpha, second proposal | T=0: {last['alpha_t0_second']:.3f}, "
            f"T=1: >= {last['alpha_t1_lower_second']:.3f} |") in f.read()
  student = Student(saved.config)
  embedding = np.asarray(tiny.params["token_embedder"]["embedding"])
  train = train_student.read_packed(("mansum", "explain"), root=root, with_hidden=True)
  batches = train_student.SignalsBatches(train, batch_size=4, seed=0)
  index = shortlist.shortlist_index(saved.head_tokens, 97)
  batch = shortlist.to_shortlist(batches.batch(batches.plan(0)[0]), index)
  assert batch["decoder_hidden"].shape[-1] == TEST_CONFIG.d_model
  untrained = student.init_params(jax.random.PRNGKey(0))
  losses = [float(student_distill.student_outputs(student, p, embedding, saved.head_tokens,
                                                  batch)[1]) for p in (untrained, saved.params)]
  assert losses[1] < losses[0], losses
  draft = student.draft(saved.params, embedding, saved.head_tokens)
  assert isinstance(draft, FeatureDraft)
  prompts = jnp.asarray(pad_prompts([[5, 6, 7], [9, 10, 11, 12]]))
  base = baseline.decode(tiny.scorer, prompts, jax.random.PRNGKey(0), max_decode_len=8,
                         warp=Warp(), eos_id=EOS)
  out = speculative.speculative_decode(tiny.scorer, draft, prompts, jax.random.PRNGKey(0),
                                       gamma=3, max_decode_len=8, warp=Warp(), eos_id=EOS,
                                       draft_inputs=prompts)
  np.testing.assert_array_equal(out.sequences, base.sequences)


def test_the_shortlist_moves_outside_mass_to_the_rest():
  index = shortlist.shortlist_index(np.array([1, 4, 7]), 10)
  assert index.tolist() == [3, 0, 3, 3, 1, 3, 3, 2, 3, 3]
  batch = {"teacher_topk_ids": np.array([[[4, 5, 1]]]),
           "teacher_topk_logprobs": np.log(np.array([[[0.5, 0.2, 0.1]]], np.float16)),
           "teacher_rest_logprob": np.log(np.array([[0.2]], np.float32)),
           "decoder_target_tokens": np.array([[5]])}
  out = shortlist.to_shortlist(batch, index)
  assert out["teacher_topk_ids"].tolist() == [[[1, 3, 0]]]
  assert out["decoder_target_tokens"].tolist() == [[3]]
  np.testing.assert_allclose(np.exp(out["teacher_rest_logprob"]), [[0.4]], rtol=1e-3)
  np.testing.assert_allclose(np.exp(out["teacher_topk_logprobs"])[0, 0, [0, 2]], [0.5, 0.1],
                             rtol=1e-3)
  with pytest.raises(ValueError, match="distinct token ids"):
    shortlist.shortlist_index(np.array([1, 1]), 10)


def test_two_stages_on_the_targets_own_rows_with_the_training_time_test(data, tmp_path,
                                                                         monkeypatch):
  """Issue 58's recipe on the tiny target: a first stage at the target's width on its own
  embedding and head (`tied_io`) trains on one task and is validated on another; the second
  starts from its export (step 0's alpha is the export's) and feeds the draft its own
  features (`test_steps=2`); the curves count training tokens and track the second
  proposal's alpha. A second stage of another shape is refused."""
  tiny, root = data
  monkeypatch.setattr(train_student, "_load_target", lambda name: _target(tiny))
  common = {"d_model": TEST_CONFIG.d_model, "reads_features": True, "tied_io": True,
            "validation_tasks": ("explain",)}
  first_config = _config(root, tasks=("mansum",), **common)
  first_dir = str(tmp_path / "stage1")
  first = _train(first_dir, first_config)
  export = os.path.join(first_dir, train_student.EXPORT)
  saved = load_student(export)
  assert saved.config.tied_io and "input_projection" not in saved.params
  with open(os.path.join(first_dir, train_student.CURVE)) as f:
    curve = json.load(f)
  pairs = {split: train_student.read_packed((task,), root=r, with_hidden=False).num_pairs
           for split, task, r in (("train", "mansum", root),
                                  ("validation", "explain", root + "_validation"))}
  assert (curve["train_pairs"], curve["validation_pairs"]) == (pairs["train"],
                                                               pairs["validation"])
  tokens = [p["tokens"] for p in curve["points"]]
  assert tokens[0] == 0 and tokens == sorted(tokens)
  assert tokens[-1] == round(first["passes"] * curve["train_tokens"])
  assert all(0.0 <= p["alpha_t0_second"] <= 1.0 for p in curve["points"])

  # The second stage also decodes validation prompts with the real loop at each evaluation.
  prompts = pad_prompts([[5, 6, 7], [9, 10, 11, 12]])
  monkeypatch.setattr(train_student, "_decoded_prompts", lambda target, task, count: prompts)
  second_config = _config(root, init_from=export, test_steps=2, passes=1.0,
                          decoded_examples=2, decoded_max_len=8, **common)
  second_dir = str(tmp_path / "stage2")
  _train(second_dir, second_config)
  np.testing.assert_array_equal(np.load(os.path.join(second_dir, train_student.HEAD)),
                                saved.head_tokens)
  with open(os.path.join(second_dir, train_student.CURVE)) as f:
    points = json.load(f)["points"]
  exported = train_student.teacher_forced_alpha(export, first_config)["validation"]
  assert points[0]["alpha_t0"] == pytest.approx(exported["alpha_t0"], abs=1e-6)
  embedding = jnp.asarray(tiny.params["token_embedder"]["embedding"])
  draft = Student(saved.config).draft(saved.params, embedding, jnp.asarray(saved.head_tokens))
  for t in (0.0, 1.0):
    by_hand = alpha_tracking.measure_alpha(
        tiny.scorer, draft, [jnp.asarray(row[None]) for row in prompts], gamma=3,
        max_decode_len=8, warp=Warp(t), eos_id=EOS, rng=jax.random.PRNGKey(0)).beta
    assert points[0]["decoded"]["explain"][f"T={t:g}"] == pytest.approx(by_hand, abs=1e-6)
  assert all(set(p["decoded"]) == {"explain"} for p in points)
  with pytest.raises(ValueError, match="another shape"):
    _train(str(tmp_path / "other"), dataclasses.replace(
        second_config, d_model=16, tied_io=False))


def test_the_training_time_test_adds_the_loss_of_the_draft_reading_its_own_features(data):
  """`test_steps=2`: the step's "test_loss" is the distillation loss of a second pass that
  reads the first pass's predicted features; a draft without features refuses it."""
  tiny, root = data
  student = Student(student_config(tiny.config, d_model=16, num_layers=1, head_size=24,
                                   head_dim=8, reads_features=True))
  train = train_student.read_packed(("mansum",), root=root, with_hidden=True)
  head = train_student.choose_head(train, 97, 24, EOS)
  batches = train_student.SignalsBatches(train, batch_size=4, seed=0)
  batch = shortlist.to_shortlist(batches.batch(batches.plan(0)[0]), shortlist.shortlist_index(
      head, 97))
  embedding = jnp.asarray(tiny.params["token_embedder"]["embedding"])
  params = student.init_params(jax.random.PRNGKey(1))
  loss_cfg = LossConfig(z_loss=0.0, distill_weight=1.0)
  _, _, predicted = student_distill.student_outputs(student, params, embedding, head, batch)
  logits, _, _ = student_distill.student_outputs(
      student, params, embedding, head, batch, predicted.astype(batch["decoder_hidden"].dtype))
  expected = float(signals_loss_terms(logits, batch, loss_cfg)[0])
  optimizer = optax.sgd(0.0)
  step = student_distill.make_train_step(student, optimizer, loss_cfg, test_steps=2)
  state = TrainState.create(jax.tree.map(jnp.array, params), optimizer)
  _, metrics = step(state, batch, jax.random.PRNGKey(0), embedding, head)
  assert float(metrics["test_loss"]) == pytest.approx(expected, rel=1e-5)
  # Reading the target's features instead gives another loss (what the test tells apart).
  teacher_forced = float(signals_loss_terms(student_distill.student_logits(
      student, params, embedding, head, batch), batch, loss_cfg)[0])
  assert abs(teacher_forced - expected) > 1e-4
  with pytest.raises(ValueError, match="reads none"):
    student_distill.make_train_step(Student(student_config(
        tiny.config, d_model=16, num_layers=1, head_size=24, head_dim=8)), optimizer, loss_cfg,
        test_steps=2)
