"""Tests of the distillation data (library and command), its format, reader and seqio Tasks.

A tiny random teacher over the real SentencePiece vocabulary decodes a tiny corpus.
"""

import dataclasses
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
from conftest import make_model

from specdec_jax import atomic_io
from specdec_jax.data import corpora, distill, layout
from specdec_jax.distillation import decode
from specdec_jax.distillation.decode import DistillConfig, DistillError
from specdec_jax.models.t5 import T5Model
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, save_hf_checkpoint

# The module-scoped fixtures run once: every test of this file on one worker.
pytestmark = pytest.mark.xdist_group("distill_data")

# Lengths with the prefix: 10 to ~40 pieces, so both buckets are used and one input is cut.
_SOURCES = {
    "ende": ["Choose Tools - Options.", "Resize the overview.", "Press Ctrl + F.",
             "Inserts a new row above the current row in the table.", "Click OK.",
             "Select the cells that you want to merge, then choose Format - Merge Cells - "
             "Merge Cells, or right-click the selection and choose Merge Cells.",
             "Opens the Styles deck."],
    "mansum": ["alarm() arranges for a signal to be delivered.", "ldd prints the shared "
               "objects (shared libraries) required by each program or shared object "
               "specified on the command line.", "cat concatenates files."],
}
_SETTINGS = dict(num_samples=1, inputs_length=32, max_decode_len=6, buckets=(16, 32),
                 batch_size=4, shard_size=3)


def _write_data_dir(root: str) -> str:
  """A prepared-looking data dir: every split of both corpora, and its manifest."""
  manifest = {"corpora": {}}
  for corpus, sources in _SOURCES.items():
    manifest["corpora"][corpus] = {}
    for split in layout.SPLITS:
      rows = [corpora.Example(f"{corpus}{i}", text, "x", f"page{i}")
              for i, text in enumerate(sources)]
      n = corpora.write_jsonl(layout.corpus_file(root, corpus, split), rows)
      manifest["corpora"][corpus][split] = {"rows": n}
  atomic_io.write_json(os.path.join(root, layout.MANIFEST), manifest)
  return root


def _write_teacher(path: str) -> str:
  model, params = make_model("test-v1_1", vocab_size=8192)
  save_hf_checkpoint(path, model.config, jax.device_get(params))
  return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(teacher dir, data dir, config writing into <data_dir>/distill)."""
  root = tmp_path_factory.mktemp("distill")
  teacher = _write_teacher(str(root / "teacher"))
  data_dir = _write_data_dir(str(root / "data"))
  return teacher, data_dir, DistillConfig(teacher=teacher, data_dir=data_dir, **_SETTINGS)


@pytest.fixture(scope="module")
def finished(setup):
  """The config of one uninterrupted run, after it."""
  _, _, config = setup
  summary = decode.distill_data(config, progress=False)
  assert summary["ende"]["complete"] and summary["mansum"]["complete"]
  return config


def _shard_bytes(root: str) -> dict[str, bytes]:
  out = {}
  for corpus in sorted(os.listdir(root)):
    directory = os.path.join(root, corpus)
    if not os.path.isdir(directory):
      continue
    for name in sorted(os.listdir(directory)):
      if name.endswith(".npz"):
        with open(os.path.join(directory, name), "rb") as f:
          out[f"{corpus}/{name}"] = f.read()
  return out


def test_outputs_are_the_teachers_and_inputs_the_training_pipelines(finished):
  data = distill.read_distilled("ende", root=finished.root)
  manifest = distill.read_manifest(os.path.join(finished.root, "ende"))
  assert manifest["complete"] and manifest["num_shards"] == 3  # 7 examples, 3 per shard.
  assert [e["count"] for e in manifest["shards"]] == [3, 3, 1]
  assert data.outputs.shape == (7, 2, 6) and data.temperatures.tolist() == [0.0, 1.0]
  assert data.ids.tolist() == [f"ende{i}" for i in range(7)]  # Back in file order.
  # Inputs: task prefix, pieces cut to inputs_length - 1, EOS, 0-padding.
  processor = spm.SentencePieceProcessor(model_file=finished.vocab)
  for i, text in enumerate(_SOURCES["ende"]):
    pieces = processor.encode(layout.CORPORA["ende"].prefix + text)[:31] + [1]
    assert data.inputs[i, :len(pieces)].tolist() == pieces
    assert not data.inputs[i, len(pieces):].any() and data.input_lengths[i] == len(pieces)
  assert data.input_lengths.max() == 32  # The long one was cut.
  # Lengths, padding and the truncation flag agree with the tokens.
  has_eos = (data.outputs == 1).any(axis=2)
  np.testing.assert_array_equal(data.truncated, ~has_eos)
  np.testing.assert_array_equal(data.output_lengths[data.truncated], 6)
  # Decoding 0 is the teacher's greedy output: each token is its argmax given the prefix.
  cfg, params = load_hf_checkpoint(finished.teacher)
  targets = data.outputs[:, 0]
  decoder_inputs = np.pad(targets[:, :-1], ((0, 0), (1, 0)))  # Start token 0, shifted.
  logits = T5Model(cfg).logits(params, jnp.asarray(data.inputs), jnp.asarray(decoder_inputs))
  logits = np.asarray(logits)
  for i in range(len(data)):
    for t in range(data.output_lengths[i, 0]):
      assert logits[i, t, targets[i, t]] >= logits[i, t].max() - 1e-4, (i, t)


def test_command_line_run_writes_shards_and_manifest(setup, tmp_path):
  teacher, data_dir, _ = setup
  out = str(tmp_path / "distill")
  cmd = [sys.executable, "-m", "experiments.distill_data", f"--teacher={teacher}",
         f"--data_dir={data_dir}", f"--output_dir={out}", "--tasks=mansum", "--num_samples=1",
         "--inputs_length=32", "--buckets=16,32", "--max_decode_len=6", "--batch_size=4",
         "--shard_size=3"]
  env = {**os.environ, layout.DATA_DIR_ENV: data_dir}  # Its job pid file goes there too.
  done = subprocess.run(cmd, capture_output=True, text=True, cwd=layout.REPO_ROOT, env=env,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "mansum: 1 shards, 3 examples, complete" in done.stdout
  assert sorted(os.listdir(os.path.join(out, "mansum"))) == ["manifest.json", "shard-00000.npz"]
  bad = subprocess.run(cmd[:3] + [f"--teacher={tmp_path / 'nowhere'}"] + cmd[4:],
                       capture_output=True, text=True, cwd=layout.REPO_ROOT, env=env,
                       check=False)
  assert bad.returncode != 0 and "--teacher=" in bad.stderr and "not a directory" in bad.stderr


def test_an_interrupted_run_resumes_to_the_same_data(finished, tmp_path):
  config = dataclasses.replace(finished, output_dir=str(tmp_path / "distill"))
  first = decode.distill_data(config, max_shards=2, progress=False)
  assert first["ende"]["shards"] == 2 and not first["ende"]["complete"]
  assert not os.path.exists(os.path.join(config.root, "mansum", distill.MANIFEST))
  # A kill between writing shard 2 and listing it leaves a file that is never read.
  with open(os.path.join(config.root, "ende", distill.shard_name(2)), "wb") as f:
    f.write(b"partial")
  with pytest.raises(distill.ShardError, match="2 of 3 shards"):
    distill.read_distilled("ende", root=config.root)
  second = decode.distill_data(config, progress=False)
  assert second["ende"]["decoded"] == 1 and second["mansum"]["decoded"] == 3
  assert _shard_bytes(config.root) == _shard_bytes(finished.root)
  again = decode.distill_data(config, progress=False)  # Finished: nothing to do.
  assert again["ende"]["decoded"] == 0 and again["mansum"]["decoded"] == 0


@pytest.fixture
def no_decoding(monkeypatch):
  """Fails the test if anything is decoded."""

  def fail(*args, **kwargs):
    raise AssertionError("decoded before the error")

  monkeypatch.setattr(decode, "decode_shard", fail)


def test_bad_teacher_path_is_an_error_before_any_work(finished, tmp_path, no_decoding):
  with pytest.raises(DistillError, match="is not a directory"):
    decode.distill_data(
        dataclasses.replace(finished, teacher=str(tmp_path / "nowhere")), progress=False)
  os.makedirs(tmp_path / "empty")
  with pytest.raises(DistillError, match="cannot be loaded"):
    decode.distill_data(
        dataclasses.replace(finished, teacher=str(tmp_path / "empty")), progress=False)


def test_vocabulary_mismatch_is_an_error_before_any_work(finished, tmp_path, no_decoding):
  text = tmp_path / "text.txt"
  text.write_text("\n".join(_SOURCES["ende"] + _SOURCES["mansum"]) * 20)
  spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "small"),
                                 vocab_size=60, minloglevel=2)
  small = str(tmp_path / "small.model")
  with pytest.raises(DistillError, match="vocab_size=8192 .* has 60 pieces"):
    decode.distill_data(dataclasses.replace(finished, vocab=small), progress=False)
  # A teacher that ships its own, other vocabulary (same size) is refused too.
  teacher = str(tmp_path / "teacher")
  shutil.copytree(finished.teacher, teacher)
  with open(os.path.join(teacher, "spiece.model"), "wb") as f:
    f.write(b"another vocabulary")
  with pytest.raises(DistillError, match="teacher ships .*spiece.model, which differs"):
    decode.distill_data(dataclasses.replace(finished, teacher=teacher), progress=False)


@pytest.mark.parametrize("damage,message", [
    (b"", "is empty"), (b"not a shard", "does not match the sha256")])
def test_empty_or_corrupt_shard_is_an_error_before_any_work(finished, tmp_path, no_decoding,
                                                             damage, message):
  root = str(tmp_path / "distill")
  shutil.copytree(finished.root, root)
  bad = os.path.join(root, "ende", distill.shard_name(1))
  with open(bad, "wb") as f:
    f.write(damage)
  config = dataclasses.replace(finished, output_dir=root)
  with pytest.raises(distill.ShardError, match=f"{bad}.*{message}.*delete") as info:
    decode.distill_data(config, progress=False)
  assert "rerun" in str(info.value)
  with pytest.raises(distill.ShardError, match=message):
    distill.read_distilled("ende", root=root)


@pytest.mark.parametrize("change", [{"seed": 1}, {"num_samples": 0}, {"temperature": 0.5}])
def test_other_settings_in_the_output_dir_are_an_error(finished, no_decoding, change):
  key = next(iter(change))
  with pytest.raises(DistillError, match=f"other settings .*{key}"):
    decode.distill_data(dataclasses.replace(finished, **change), progress=False)


def test_more_samples_are_added_to_an_earlier_run(finished, tmp_path):
  more = dataclasses.replace(finished, num_samples=2, tasks=("mansum",))
  direct = dataclasses.replace(more, output_dir=str(tmp_path / "direct"))
  decode.distill_data(direct, progress=False)
  added = dataclasses.replace(more, output_dir=str(tmp_path / "added"))
  shutil.copytree(os.path.join(finished.root, "mansum"), os.path.join(added.root, "mansum"))
  manifest = distill.read_manifest(os.path.join(added.root, "mansum"))
  for entry in manifest["shards"]:
    entry.pop("decodings")  # As the first version of the command wrote them.
  distill.write_manifest(os.path.join(added.root, "mansum"), manifest)
  summary = decode.distill_data(added, progress=False)
  assert summary["mansum"]["complete"] and summary["mansum"]["decoded"] == 3
  data = distill.read_distilled("mansum", root=added.root)
  assert data.outputs.shape[1] == 3 and data.temperatures.tolist() == [0.0, 1.0, 1.0]
  np.testing.assert_array_equal(
      data.outputs[:, :2], distill.read_distilled("mansum", root=finished.root).outputs)
  assert _shard_bytes(added.root) == _shard_bytes(direct.root)


def test_seqio_tasks_serve_the_targets_outputs(finished):
  import seqio  # TensorFlow: imported here only.

  from specdec_jax.data import pipeline, tasks

  tasks.register_tasks(finished.data_dir)
  data = distill.read_distilled("mansum", root=finished.root)
  task = seqio.get_mixture_or_task("specdec_distill_mansum")
  assert task.num_input_examples("train") == 3 * 2
  rows = list(task.get_dataset({"inputs": 32, "targets": 6}, split="train",
                               shuffle=False).as_numpy_iterator())
  inputs, targets, which = data.pairs()
  assert len(rows) == len(inputs) == 6
  for row, x, y, (i, d) in zip(rows, inputs, targets, which, strict=True):
    assert row["inputs"].tolist() == x[:data.input_lengths[i]].tolist()
    assert row["targets"].tolist() == y[:data.output_lengths[i, d]].tolist()
  batch = next(pipeline.get_batches("specdec_distill_mix", "train", batch_size=4,
                                    inputs_length=32, targets_length=6,
                                    data_dir=finished.data_dir))
  assert batch["encoder_input_tokens"].shape == (4, 32)
  assert batch["decoder_target_tokens"].shape == (4, 6)
