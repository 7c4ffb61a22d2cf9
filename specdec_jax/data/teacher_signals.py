"""The target's signals along the distillation data: the on-disk format, and a reader.

`python -m experiments.teacher_signals` runs the target once over every shard of a
corpus's distillation data (`specdec_jax.data.distill`) and stores what a draft's
training step would otherwise recompute with the target each step:

<data_dir>/distill/<corpus>/signals/
  signals-00000.npz ...  one per distillation shard: the same shard number, the same
                         rows in the same order as shard-00000.npz ...
  manifest.json          settings (top_k, the target's sha256) and, per finished shard,
                         its rows, decodings, lengths, sha256, the sha256 of the
                         distillation shard it was computed from, seconds and examples/s
                         (rewritten atomically after each shard)

A signals shard holds, for the `n` rows and `D` decodings of its distillation shard:
  index           int64   [n]               the distillation shard's `index` (to join, checked)
  encoder_hidden  float16 [n, L_in, d]      the target's final encoder outputs for `inputs`
                                            (`T5Model.encode(...).hidden`); L_in = the
                                            shard's largest `input_lengths`; 0 from
                                            position input_length on. A decoder-only
                                            target: its final-normed hidden states at
                                            the prompt's positions 0 .. n - 2 (its
                                            prefill: `LlamaScorer.init_state_with_features`),
                                            0 from n - 1 on
  decoder_hidden  float16 [n, D, L_out, f]  a decoder-only target's final-normed hidden
                                            state at output position t of decoding d
                                            (the one its logits there come from; what a
                                            `drafts.FeatureDraft` reads); f = 0 (no
                                            bytes) for a T5 target, and in format /2
  topk_ids        int32   [n, D, L_out, k]  at position t of decoding d: the k most probable
                                            next tokens given the input and
                                            outputs[:, d, :t], most probable first (teacher
                                            forcing: decoder inputs are 0 then
                                            outputs[..., :-1], the training pipeline's shift;
                                            a decoder-only target reads its prompt, then
                                            outputs[..., :t])
  topk_logprobs   float16 [n, D, L_out, k]  their log-probabilities (temperature 1, softmax
                                            over the whole vocabulary, computed in float32)
  rest_logprob    float32 [n, D, L_out]     log of the probability outside the top k:
                                            log(max(1 - sum exp(topk_logprobs), tiny)),
                                            from the logits (a logsumexp over the rest)
L_out = the shard's largest `output_lengths` (not the distillation shard's padded width);
`topk_*` and `rest_logprob` are 0 from position output_length on. Numpy only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np

from specdec_jax import atomic_io
from specdec_jax.data import distill, npz_io

FORMAT = "specdec_signals/3"
# /2 (no decoder_hidden) reads as f = 0; /1 stored topk_ids as int16.
READABLE = (FORMAT, "specdec_signals/2")
MANIFEST = "manifest.json"
SUBDIR = "signals"
SIGNAL_FIELDS = ("index", "encoder_hidden", "decoder_hidden", "topk_ids", "topk_logprobs",
                 "rest_logprob")
DTYPES = {"index": np.int64, "encoder_hidden": np.float16, "decoder_hidden": np.float16,
          "topk_ids": np.int32, "topk_logprobs": np.float16, "rest_logprob": np.float32}
RUN_COMMAND = "python -m experiments.teacher_signals"
# The floor of rest_logprob: log of the smallest normal float32.
LOG_TINY = float(np.log(np.finfo(np.float32).tiny))


class SignalError(distill.ShardError):
  """A signals manifest or shard that is missing, corrupt or does not match its data."""


def signals_dir(distill_directory: str) -> str:
  """The signals directory of one corpus's distillation directory."""
  return os.path.join(distill_directory, SUBDIR)


def corpus_signals_dir(corpus: str, data_dir: str | None = None, *,
                       root: str | None = None) -> str:
  """`<root>/<corpus>/signals` (root: the distill root, default `<data_dir>/distill`)."""
  return signals_dir(distill.task_dir(root or distill.distill_root(data_dir), corpus))


def signal_name(shard: int) -> str:
  return f"signals-{shard:05d}.npz"


def _rerun(corpus: str) -> str:
  return f"`{RUN_COMMAND} --tasks={corpus}`"


def shard_bytes(arrays: dict[str, np.ndarray]) -> bytes:
  """A signals shard as .npz bytes that depend on the arrays only.

  Raises:
    ValueError: a field is missing or has another dtype than `DTYPES`.
  """
  wrong = {k: str(arrays[k].dtype) for k in SIGNAL_FIELDS
           if k in arrays and arrays[k].dtype != DTYPES[k]}
  if wrong:
    raise ValueError(f"signal arrays of other dtypes than the format's: {wrong}.")
  return npz_io.npz_bytes(arrays, SIGNAL_FIELDS)


def read_manifest(directory: str) -> dict:
  """The signals manifest of `directory` (a corpus's signals directory).

  Raises:
    FileNotFoundError: there is none (the message says how to make it).
    SignalError: it is not valid JSON of this format.
  """
  path = os.path.join(directory, MANIFEST)
  corpus = os.path.basename(os.path.dirname(os.path.normpath(directory)))
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: run {_rerun(corpus)} to compute the "
                            "target's signals.")
  try:
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise SignalError(f"{path} is not readable JSON ({e}): delete {directory} and rerun "
                      f"{_rerun(corpus)}.") from e
  if manifest.get("format") not in READABLE:
    raise SignalError(f"{path} has format {manifest.get('format')!r}, not {FORMAT!r}: delete "
                      f"{directory} and rerun {_rerun(corpus)}.")
  return manifest


def write_manifest(directory: str, manifest: dict) -> None:
  atomic_io.write_json(os.path.join(directory, MANIFEST), manifest)


def signal_entries(corpus: str, data_dir: str | None = None, *,
                   root: str | None = None) -> list[dict]:
  """The manifest entries of a corpus's finished signals shards, by shard number.

  Each entry: {"shard", "file", "count", "decodings", "input_length", "output_length",
  "sha256", "distill_file", "distill_sha256", "seconds", "examples_per_s"}.

  Raises:
    FileNotFoundError, SignalError: see `read_manifest`.
  """
  manifest = read_manifest(corpus_signals_dir(corpus, data_dir, root=root))
  return sorted(manifest["shards"], key=lambda e: e["shard"])


def read_signal_shard(directory: str, entry: dict, *,
                      index: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Reads and checks one signals shard listed in a manifest.

  Args:
    directory: the corpus's signals directory.
    entry: the shard's manifest entry (see `signal_entries`).
    index: int64 `[n]`, the distillation shard's `index`; the shard's must equal it.

  Returns:
    {field: array} for every field in `SIGNAL_FIELDS` (shapes in the module docstring).

  Raises:
    SignalError: the file is missing, empty, fails its checksum, is unreadable, or its
      rows, shapes or index disagree with its entry or `index`; the message names the
      file and the fix.
  """
  path = os.path.join(directory, entry["file"])
  corpus = os.path.basename(os.path.dirname(os.path.normpath(directory)))
  fix = f"rerun {_rerun(corpus)}: it computes shard {entry['shard']} again."
  if not os.path.exists(path):
    raise SignalError(f"{path} is listed in the manifest but missing: {fix}")
  with open(path, "rb") as f:
    data = f.read()
  if not data:
    raise SignalError(f"{path} is empty (0 bytes): {fix}")
  if distill.sha256_bytes(data) != entry["sha256"]:
    raise SignalError(f"{path} does not match the sha256 in its manifest (corrupt or "
                      f"overwritten): {fix}")
  try:
    if entry.get("format", "specdec_signals/2") == FORMAT:
      arrays = npz_io.load_npz(data, SIGNAL_FIELDS)
    else:  # /2: no decoder features.
      arrays = npz_io.load_npz(data, tuple(f for f in SIGNAL_FIELDS if f != "decoder_hidden"))
      arrays["decoder_hidden"] = np.zeros(arrays["rest_logprob"].shape + (0,), np.float16)
  except ValueError as e:
    raise SignalError(f"{path} is not a readable signals shard ({e}): {fix}") from e
  n, d = entry["count"], entry["decodings"]
  expected = {
      "index": (n,), "encoder_hidden": (n, entry["input_length"], None),
      "topk_ids": (n, d, entry["output_length"], None),
      "decoder_hidden": (n, d, entry["output_length"], None),
      "topk_logprobs": arrays["topk_ids"].shape, "rest_logprob": (n, d, entry["output_length"])}
  for name, shape in expected.items():
    got = arrays[name].shape
    if len(got) != len(shape) or any(s is not None and s != g
                                     for s, g in zip(shape, got, strict=True)):
      raise SignalError(f"{path}: {name} has shape {got}, its manifest entry says "
                        f"{tuple('?' if s is None else s for s in shape)}: {fix}")
  wrong = {k: str(a.dtype) for k, a in arrays.items() if a.dtype != DTYPES[k]}
  if wrong:
    raise SignalError(f"{path} holds arrays of other dtypes than {FORMAT}'s ({wrong}): {fix}")
  if index is not None and not np.array_equal(arrays["index"], index):
    raise SignalError(f"{path} holds other rows than its distillation shard "
                      f"{entry['distill_file']} (their `index` differ): {fix}")
  return arrays


def iter_joined(corpus: str, data_dir: str | None = None, *, root: str | None = None,
                require_complete: bool = True) -> Iterator[dict[str, np.ndarray]]:
  """Per distillation shard, its arrays joined with its signals (no TensorFlow).

  Args:
    corpus: "ende" or "mansum".
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    root: the distill root; default `<data_dir>/distill`.
    require_complete: refuse a corpus whose decoding or signals are unfinished (else
      yield the shards that have both).

  Yields:
    {field: array}: the distillation shard's `distill.SHARD_FIELDS` (shapes in
    specdec_jax/data/distill.py; `outputs` keep their padded width, wider than the
    signals' L_out) and the signals' `SIGNAL_FIELDS`, rows in the shard's order.

  Raises:
    FileNotFoundError: no distillation or signals manifest.
    SignalError, distill.ShardError: an unfinished corpus (with `require_complete`), a
      bad shard, or signals of another target or of another version of a shard.
  """
  directory = distill.task_dir(root or distill.distill_root(data_dir), corpus)
  manifest = distill.read_manifest(directory)
  sig_dir = signals_dir(directory)
  signals = read_manifest(sig_dir)
  if signals["settings"]["teacher_sha256"] != manifest["settings"]["teacher_sha256"]:
    raise SignalError(f"{sig_dir} holds signals of another target than the one that decoded "
                      f"{directory}: delete {sig_dir} and rerun {_rerun(corpus)}.")
  entries = {e["shard"]: e for e in signals["shards"]}
  missing = [e["shard"] for e in manifest["shards"] if e["shard"] not in entries]
  if require_complete and (not manifest["complete"] or missing):
    raise SignalError(
        f"{sig_dir}: signals for {len(manifest['shards']) - len(missing)} of "
        f"{manifest['num_shards']} shards (decoding complete: {manifest['complete']}); "
        f"finish `{distill.RUN_COMMAND}` and rerun {_rerun(corpus)} (both resume), or pass "
        "require_complete=False to read what is there.")
  for entry in sorted(manifest["shards"], key=lambda e: e["shard"]):
    signal = entries.get(entry["shard"])
    if signal is None:
      continue
    if signal["distill_sha256"] != entry["sha256"]:
      raise SignalError(
          f"{os.path.join(sig_dir, signal['file'])} was computed from another version of "
          f"{entry['file']} (rewritten since, e.g. with more samples): rerun "
          f"{_rerun(corpus)}, which computes it again.")
    arrays = distill.load_shard(directory, entry)
    arrays.update(read_signal_shard(sig_dir, signal, index=arrays["index"]))
    yield arrays
