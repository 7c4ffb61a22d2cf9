"""Tests of the target's stored signals (computation, format, reader, resume) and of the
distillation data's token archive.

A tiny random teacher and a tiny distillation directory written with the format's own
functions (random inputs and outputs: the signals do not care who wrote them).
"""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from unittest import mock

import jax
import numpy as np
import pytest

from specdec_jax.data import distill, distill_archive, layout
from specdec_jax.data import teacher_signals as ts
from specdec_jax.distillation import signals, teacher
from specdec_jax.distillation.teacher import DistillError, load_t5_teacher
from specdec_jax.models.layers import ParamInfo
from specdec_jax.models.llama import TEST_CONFIG, LlamaModel, LlamaScorer, pad_prompts
from specdec_jax.models.t5 import T5Model, get_config
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, save_hf_checkpoint

# The module-scoped fixtures run once: every test of this file on one worker.
pytestmark = pytest.mark.xdist_group("teacher_signals")

_INPUTS_LENGTH, _MAX_DECODE_LEN, _DECODINGS, _SHARD_SIZE = 32, 8, 3, 4
# ende: shards 0 and 1 in the 16-token input bucket, shard 2 in the 32-token one; every
# batch holds 4 rows (batch_size 4), so two programs compile.
_COUNTS = {"ende": 12, "mansum": 4}


def _write_teacher(path: str, seed: int) -> None:
  """A tiny random T5 (no initialiser to compile: the declared shapes, filled here)."""
  model = T5Model(get_config("test-v1_1"))
  rng = np.random.default_rng(seed)

  def fill(where, info: ParamInfo) -> np.ndarray:
    if "scale" in jax.tree_util.keystr(where):
      return np.ones(info.shape, np.float32)
    return (rng.standard_normal(info.shape) / np.sqrt(info.shape[0])).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(fill, model.param_info(),
                                            is_leaf=lambda x: isinstance(x, ParamInfo))
  save_hf_checkpoint(path, model.config, params)


def _distill_arrays(rng: np.random.Generator, n: int, vocab: int) -> dict[str, np.ndarray]:
  """Rows of a corpus as distill_data writes them (sorted by input length), random tokens."""
  long = 4 if n > 2 * _SHARD_SIZE else 0  # The last shard's rows: 17..32 input tokens.
  input_lengths = np.sort(np.concatenate([rng.integers(3, 17, n - long),
                                          rng.integers(17, _INPUTS_LENGTH + 1, long)]))
  input_lengths = input_lengths.astype(np.int32)
  inputs = np.zeros((n, _INPUTS_LENGTH), np.int32)
  output_lengths = rng.integers(1, _MAX_DECODE_LEN + 1, (n, _DECODINGS)).astype(np.int32)
  outputs = np.zeros((n, _DECODINGS, _MAX_DECODE_LEN), np.int32)
  truncated = np.zeros((n, _DECODINGS), bool)
  for i in range(n):
    inputs[i, :input_lengths[i]] = rng.integers(2, vocab, input_lengths[i])
    inputs[i, input_lengths[i] - 1] = 1  # EOS
    for d in range(_DECODINGS):
      length = output_lengths[i, d]
      outputs[i, d, :length] = rng.integers(2, vocab, length)
      truncated[i, d] = length == _MAX_DECODE_LEN and i % 2 == 0
      if not truncated[i, d]:
        outputs[i, d, length - 1] = 1
  return {"ids": np.array([f"row{i}" for i in range(n)]),
          "index": rng.permutation(n).astype(np.int64), "inputs": inputs,
          "input_lengths": input_lengths, "outputs": outputs, "output_lengths": output_lengths,
          "truncated": truncated}


def _write_distill(root: str, corpus: str, teacher_sha: str, vocab: int, seed: int) -> None:
  """A complete distillation directory of `_COUNTS[corpus]` rows."""
  rows = _distill_arrays(np.random.default_rng(seed), _COUNTS[corpus], vocab)
  directory = distill.task_dir(root, corpus)
  entries = []
  for shard, start in enumerate(range(0, _COUNTS[corpus], _SHARD_SIZE)):
    stop = min(start + _SHARD_SIZE, _COUNTS[corpus])
    data = distill.shard_bytes({k: v[start:stop] for k, v in rows.items()})
    name = distill.shard_name(shard)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
      f.write(data)
    entries.append({"shard": shard, "file": name, "start": start, "stop": stop,
                    "count": stop - start, "decodings": _DECODINGS,
                    "sha256": distill.sha256_bytes(data), "seconds": 1.5})
  distill.write_manifest(directory, {
      "format": distill.FORMAT, "corpus": corpus, "task": f"specdec_distill_{corpus}",
      "settings": {"teacher_sha256": teacher_sha, "inputs_length": _INPUTS_LENGTH,
                   "max_decode_len": _MAX_DECODE_LEN, "temperatures": [0.0, 1.0, 1.0]},
      "num_examples": _COUNTS[corpus], "num_shards": len(entries), "shards": entries,
      "complete": True})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(config over a fresh copy of the distillation data, where the pristine copy is)."""
  root = tmp_path_factory.mktemp("signals")
  teacher = str(root / "teacher")
  _write_teacher(teacher, seed=0)
  cfg, _, sha = load_t5_teacher(teacher)
  pristine = str(root / "pristine")
  for seed, corpus in enumerate(_COUNTS):
    _write_distill(os.path.join(pristine, "distill"), corpus, sha, cfg.vocab_size, seed)
  return signals.SignalsConfig(teacher=teacher, data_dir=str(root / "data"), top_k=8,
                               batch_size=4), pristine


def _fresh(setup, name: str) -> signals.SignalsConfig:
  """The config over a fresh copy of the pristine distillation data (no signals)."""
  config, pristine = setup
  data_dir = os.path.join(os.path.dirname(config.data_dir), name)
  shutil.copytree(pristine, data_dir)
  return dataclasses.replace(config, data_dir=data_dir)


@pytest.fixture(scope="module")
def finished(setup):
  """The config of one uninterrupted run over both corpora, after it."""
  config = _fresh(setup, "finished")
  summary = signals.compute_signals(config)
  assert summary["ende"]["complete"] and summary["ende"]["computed"] == 12
  assert summary["mansum"]["complete"] and summary["mansum"]["shards"] == 1
  return config


def _files(directory: str) -> dict[str, bytes]:
  out = {}
  for name in sorted(os.listdir(directory)):
    if os.path.isfile(os.path.join(directory, name)) and not name.startswith("."):
      with open(os.path.join(directory, name), "rb") as f:
        out[name] = f.read()
  return out


def test_signals_equal_a_direct_full_softmax(finished):
  cfg, params = load_hf_checkpoint(finished.teacher)
  model = T5Model(cfg)
  shards = list(ts.iter_joined("ende", finished.data_dir))
  assert [len(s["index"]) for s in shards] == [4, 4, 4]
  assert [s["encoder_hidden"].shape[1] <= 16 for s in shards] == [True, True, False]
  for s in shards:
    n, d = s["output_lengths"].shape
    l_in, l_out = s["input_lengths"].max(), s["output_lengths"].max()
    assert s["encoder_hidden"].shape == (n, l_in, cfg.d_model)
    assert s["topk_ids"].shape == (n, d, l_out, 8) and s["rest_logprob"].shape == (n, d, l_out)
    assert {k: s[k].dtype for k in ts.SIGNAL_FIELDS} == {k: np.dtype(v)
                                                        for k, v in ts.DTYPES.items()}
    # The target at the full padded widths, teacher-forced as the training pipeline shifts.
    hidden = np.asarray(model.encoder_outputs(params, s["inputs"]))          # [n, 32, d]
    decoder_inputs = np.pad(s["outputs"][..., :-1], ((0, 0), (0, 0), (1, 0)))
    logits = np.asarray(model.logits(params, np.repeat(s["inputs"], d, axis=0),
                                     decoder_inputs.reshape(n * d, -1)), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))           # [n*d, 8, V]
    logp = logp.reshape(n, d, _MAX_DECODE_LEN, -1)[:, :, :l_out]
    real_in = np.arange(l_in) < s["input_lengths"][:, None]
    np.testing.assert_allclose(s["encoder_hidden"][real_in], hidden[:, :l_in][real_in],
                               rtol=2e-3, atol=2e-3)
    assert not s["encoder_hidden"][~real_in].any()
    real = np.arange(l_out) < s["output_lengths"][..., None]                # [n, d, L_out]
    ids = s["topk_ids"].astype(np.int64)
    top = -np.sort(-logp, axis=-1)[..., :8]
    # The stored ids are a top 8 (ties aside), most probable first, with their log-probs.
    np.testing.assert_allclose(np.take_along_axis(logp, ids, -1)[real], top[real], atol=1e-4)
    np.testing.assert_allclose(s["topk_logprobs"][real].astype(np.float64), top[real],
                               rtol=1e-3, atol=1e-3)
    rest = np.log1p(-np.exp(top).sum(-1))
    np.testing.assert_allclose(s["rest_logprob"][real], rest[real], rtol=1e-4, atol=1e-5)
    assert not ids[~real].any() and not s["topk_logprobs"][~real].any()
    assert not s["rest_logprob"][~real].any()


def test_rest_mass_of_the_whole_vocabulary_is_floored():
  logits = np.array([[0.0, 1.0, 2.0]], np.float32)
  top = jax.jit(teacher.top_k_logprobs, static_argnums=1)
  ids, logprobs, rest = (np.asarray(x) for x in top(logits, 3))
  assert ids.tolist() == [[2, 1, 0]] and rest.tolist() == [ts.LOG_TINY]
  np.testing.assert_allclose(np.exp(logprobs).sum(), 1.0, rtol=1e-6)


def test_a_decoder_only_targets_signals_are_its_teacher_forced_log_probs():
  """`llama_signals` (the GGUF teacher's path): prompts of different lengths, each
  prefilled once for its decodings; the top-k of the full model's log-softmax after each
  prompt and output prefix."""
  model = LlamaModel(TEST_CONFIG)
  params = model.init_params(jax.random.PRNGKey(0))
  scorer = LlamaScorer(model, model.prepare(params))
  prompts = [[5, 6, 7, 8], [11, 12]]
  outputs = np.random.RandomState(1).randint(1, 97, size=(2, 3, 5)).astype(np.int32)
  decoder_inputs = np.pad(outputs[..., :-1], ((0, 0), (0, 0), (1, 0)))
  prompt_features, ids, logprobs, rest, features = (np.asarray(x) for x in teacher.llama_signals(
      scorer, pad_prompts(prompts), decoder_inputs, top_k=4))
  assert ids.shape == (2, 3, 5, 4) and rest.shape == (2, 3, 5)
  assert prompt_features.shape == (2, 4, 32) and features.shape == (2, 3, 5, 32)
  embedding = np.asarray(params["token_embedder"]["embedding"], np.float64)  # The tied head.
  for row, prompt in enumerate(prompts):
    for d in range(3):
      text = np.asarray([prompt + outputs[row, d, :-1].tolist()], np.int32)
      every = np.asarray(model.logits(params, text), np.float64)[0]
      # The features are what the head reads: along the prompt but its last token, then
      # along the decoding; 0 in the prompt's padding.
      n = len(prompt)
      np.testing.assert_allclose(prompt_features[row, :n - 1] @ embedding.T, every[:n - 1],
                                 atol=1e-3)
      assert not prompt_features[row, n - 1:].any()
      np.testing.assert_allclose(features[row, d] @ embedding.T, every[n - 1:], atol=1e-3)
      logits = every[len(prompt) - 1:]
      logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))            # [5, V]
      top = -np.sort(-logp, axis=-1)[:, :4]
      np.testing.assert_allclose(np.take_along_axis(logp, ids[row, d], -1), top, atol=1e-4)
      np.testing.assert_allclose(logprobs[row, d], top, atol=1e-4)
      np.testing.assert_allclose(rest[row, d], np.log1p(-np.exp(top).sum(-1)), atol=1e-4)


def test_a_resumed_run_skips_finished_shards_and_writes_the_same_bytes(setup, finished):
  config = _fresh(setup, "resumed")
  first = signals.compute_signals(config, max_shards=2)
  assert first["ende"]["shards"] == 2 and not first["ende"]["complete"]
  assert first["mansum"]["shards"] == 0
  lines = []
  second = signals.compute_signals(config, report=lines.append)
  assert second["ende"]["computed"] == 4 and second["mansum"]["computed"] == 4
  assert [line.split(" (")[0] for line in lines] == ["ende shard 2", "mansum shard 0"]
  assert "(3 of 3)" in lines[0] and "tokens/hour" in lines[0]
  assert second["ende"]["tokens_per_hour"] > 0
  for corpus in _COUNTS:
    got = _files(ts.corpus_signals_dir(corpus, config.data_dir))
    want = _files(ts.corpus_signals_dir(corpus, finished.data_dir))
    assert got.keys() == want.keys()
    assert {k: v for k, v in got.items() if k != ts.MANIFEST} == {
        k: v for k, v in want.items() if k != ts.MANIFEST}
  entry = ts.signal_entries("ende", config.data_dir)[0]
  assert entry["seconds"] > 0 and entry["examples_per_s"] > 0 and entry["tokens_per_hour"] > 0
  # A listed file that was damaged is computed again; the others are skipped.
  bad = os.path.join(ts.corpus_signals_dir("ende", config.data_dir), ts.signal_name(1))
  with open(bad, "wb") as f:
    f.write(b"damaged")
  third = signals.compute_signals(config)
  assert third["ende"]["computed"] == 4 and third["mansum"]["computed"] == 0
  assert _files(os.path.dirname(bad)) == _files(
      ts.corpus_signals_dir("ende", finished.data_dir)) | {ts.MANIFEST: mock.ANY}


def _signal_files(config: signals.SignalsConfig) -> dict[str, dict[str, bytes]]:
  return {c: {k: v for k, v in _files(ts.corpus_signals_dir(c, config.data_dir)).items()
              if k != ts.MANIFEST} for c in _COUNTS}


def test_the_command_killed_at_any_point_resumes_without_losing_or_repeating(setup, finished):
  """kill -9 the command while it computes; the rerun keeps every shard written before
  (the same file, not rewritten) and ends with the uninterrupted run's bytes."""
  config = _fresh(setup, "killed")
  command = [sys.executable, "-m", "experiments.teacher_signals", f"--teacher={config.teacher}",
             f"--data_dir={config.data_dir}", f"--top_k={config.top_k}",
             f"--batch_size={config.batch_size}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  manifest = os.path.join(ts.corpus_signals_dir("ende", config.data_dir), ts.MANIFEST)
  process = subprocess.Popen(command, cwd=layout.REPO_ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
  deadline = time.time() + 300
  while process.poll() is None and time.time() < deadline:
    if os.path.exists(manifest) and ts.read_manifest(os.path.dirname(manifest))["shards"]:
      break  # One shard written, the next under way.
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert process.returncode == -signal.SIGKILL, "it finished before it could be killed"
  kept = {e["file"]: os.stat(os.path.join(os.path.dirname(manifest), e["file"])).st_mtime_ns
          for e in ts.read_manifest(os.path.dirname(manifest))["shards"]}
  assert kept
  rerun = subprocess.run(command, cwd=layout.REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert _signal_files(config) == _signal_files(finished)
  assert {f: os.stat(os.path.join(os.path.dirname(manifest), f)).st_mtime_ns
          for f in kept} == kept
  recomputed = [line for line in rerun.stdout.splitlines() if line.startswith("ende shard")]
  assert len(recomputed) == len(_files(os.path.dirname(manifest))) - 1 - len(kept)


def test_the_disk_budget_stops_the_run_before_a_shard_passes_it(setup):
  config = dataclasses.replace(_fresh(setup, "budget"), max_disk_gb=2e-5)  # 20 kB
  with pytest.raises(DistillError, match="passes --max_disk_gb=2e-05"):
    signals.compute_signals(config)
  listed = ts.signal_entries("ende", config.data_dir)
  used = sum(os.path.getsize(os.path.join(ts.corpus_signals_dir("ende", config.data_dir),
                                          e["file"])) for e in listed)
  assert used <= 2e4
  assert sorted(os.listdir(ts.corpus_signals_dir("ende", config.data_dir))) == sorted(
      [ts.MANIFEST, *(e["file"] for e in listed)])
  with pytest.raises(DistillError, match="max_disk_gb"):
    signals.compute_signals(dataclasses.replace(config, max_disk_gb=0))


def test_follow_trails_an_unfinished_decoding(setup, finished):
  config = _fresh(setup, "follow")
  directory = distill.task_dir(config.root, "ende")
  full = distill.read_manifest(directory)
  partial = {**full, "shards": full["shards"][:1], "complete": False}
  distill.write_manifest(directory, partial)
  waits = []

  def report(line: str) -> None:
    if line.startswith("waiting"):
      waits.append(line)
      distill.write_manifest(directory, full)  # The decoding finishes meanwhile.

  summary = signals.compute_signals(dataclasses.replace(config, tasks=("ende",)), follow=True,
                                    poll_seconds=0, report=report)
  assert len(waits) == 1 and "ende: 1 of 3 shards decoded, 1 with signals" in waits[0]
  assert summary["ende"]["complete"] and summary["ende"]["computed"] == 12
  assert ts.read_manifest(ts.signals_dir(directory))["complete"]
  assert _files(ts.signals_dir(directory)) == _files(
      ts.corpus_signals_dir("ende", finished.data_dir)) | {ts.MANIFEST: mock.ANY}


def test_bad_or_mismatched_shards_are_clear_errors(setup, finished, tmp_path):
  data_dir = str(tmp_path / "data")
  shutil.copytree(finished.data_dir, data_dir)
  sig_dir = ts.corpus_signals_dir("ende", data_dir)
  entries = ts.signal_entries("ende", data_dir)
  # Corrupt: named, with the command that fixes it.
  path = os.path.join(sig_dir, entries[1]["file"])
  with open(path, "r+b") as f:
    f.seek(100)
    f.write(b"\0\0\0\0")
  with pytest.raises(ts.SignalError, match=f"{path} does not match the sha256.*rerun "
                     "`python -m experiments.teacher_signals --tasks=ende`"):
    list(ts.iter_joined("ende", data_dir))
  # Rows of another shard.
  with pytest.raises(ts.SignalError, match="other rows than its distillation shard"):
    ts.read_signal_shard(sig_dir, entries[0], index=np.arange(4) + 100)
  # A distillation shard rewritten after its signals were computed.
  shutil.copytree(finished.data_dir, str(tmp_path / "rewritten"))
  directory = distill.task_dir(os.path.join(tmp_path, "rewritten", "distill"), "ende")
  manifest = distill.read_manifest(directory)
  manifest["shards"][0]["sha256"] = "0" * 64
  distill.write_manifest(directory, manifest)
  with pytest.raises(ts.SignalError, match="another version of shard-00000.npz"):
    next(ts.iter_joined("ende", str(tmp_path / "rewritten")))
  # Unfinished: says which commands to finish.
  config = _fresh(setup, "unfinished")
  signals.compute_signals(config, max_shards=1)
  with pytest.raises(ts.SignalError, match="signals for 1 of 3 shards.*distill_data"):
    list(ts.iter_joined("ende", config.data_dir))
  assert len(list(ts.iter_joined("ende", config.data_dir, require_complete=False))) == 1
  # Other settings in the same directory, or another teacher, before any work.
  with pytest.raises(DistillError, match="other settings .*top_k: 8 there, 4 now"):
    signals.compute_signals(dataclasses.replace(config, top_k=4))
  other = str(tmp_path / "other_teacher")
  _write_teacher(other, seed=1)
  with pytest.raises(DistillError, match="is not the target that decoded"):
    signals.compute_signals(dataclasses.replace(config, teacher=other))


def test_token_archive_round_trip_is_byte_identical(setup, tmp_path):
  _, pristine = setup
  archive = str(tmp_path / "tokens.npz")
  counts = distill_archive.export_archive(archive, ("ende", "mansum"), data_dir=pristine)
  assert counts == {"ende": 12, "mansum": 4}
  back = str(tmp_path / "back")  # Any root: --output_dir, as a GGUF target's data uses.
  cmd = [sys.executable, "-m", "experiments.distill_data", "--archive=import",
         f"--archive_file={archive}", f"--output_dir={back}"]
  done = subprocess.run(cmd, capture_output=True, text=True, cwd=layout.REPO_ROOT, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "ende: 12 examples unpacked from" in done.stdout
  for corpus in _COUNTS:
    assert _files(distill.task_dir(back, corpus)) == _files(
        distill.task_dir(os.path.join(pristine, "distill"), corpus))
  again = distill_archive.export_archive(str(tmp_path / "again.npz"), ("ende", "mansum"),
                                         root=back)
  assert again == counts and _files(str(tmp_path))["again.npz"] == _files(
      str(tmp_path))["tokens.npz"]
  with pytest.raises(ValueError, match="already holds distillation data"):
    distill_archive.import_archive(archive, root=back)
