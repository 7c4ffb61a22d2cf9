r"""A prepared accelerator check: step costs, both decoders, and jax#40101, on one device.

The project was built and measured on a 2-core CPU. This command measures it on
whatever device jax sees first (one GPU or TPU chip) in a few minutes, and
needs only jax, flax, numpy, safetensors and sentencepiece (and absl, which
flax imports): no gin, seqio, TensorFlow or torch, no network, no install
(the repository on `PYTHONPATH` is enough).

  bash experiments/device_check.sh OUT_DIR          # the full check, < 8 min on one H200
  PYTHONPATH=. python -m experiments.device_check --output_dir=OUT_DIR [--smoke]
  bash experiments/device_check.sh OUT_DIR --regime_map   # the T5 regime map's sweep instead

Inputs are the first En-De test prompts (`specdec_jax.data.prompts`: the committed
`assets/prompts/ende_test.jsonl` when `data_cache/` is absent), tokenized with
the committed SentencePiece model; the models are the shipped family
(`assets/models/`). Sections, in order, each a kind of row (`section`):

  environment   jax / jaxlib / flax versions, backend, device kind, the settings.
  jax_40101     our smallest loop writes (the baseline's token write, a draft
                cache layer's key and value writes) timed per write in a jitted
                loop over a small and a large buffer, on the default backend and
                on the CPU: an in-place write costs the same at both sizes; the
                regression of jax#40101 (XLA:CPU, jaxlib 0.11.1+, updates under
                256 bytes) rewrites the whole buffer and scales with its size.
  target_step   T_step and T_verify(k)/T_step, k = 1..max_k, per dtype and
                batch size (`benchmarking.target_step_times`).
  cache_length  the target's one-token step T_step at the decoders' cache and
                at a long one, beside the ratio of bytes a step reads at each
                (decoder weights plus self-attention keys/values): a whole-cache
                rewrite per step shows as a time ratio well above the bytes
                ratio (context for jax_40101, which is the direct check).
  decode        per (draft, dtype, batch size, temperature) at one gamma:
                baseline and speculative ms/token (medians over repetitions of
                the total over all batches, the two interleaved, compilation
                apart), the speedup, alpha by both estimators, tokens per target
                call, the draft's cost c, the speedups Theorem 3.8 and the
                cost model predict, and whether greedy speculative tokens equal
                the baseline's (recorded, not enforced: on an accelerator a
                k-token call may round differently from k one-token calls).
  skipped       decode points left out because the time budget ran out.
  error         decode points that raised (the message); the run goes on.

Every row goes to OUT_DIR/results.jsonl as soon as it is measured (the file is
rewritten atomically, so a run cut short keeps its rows; a new run replaces
them), and OUT_DIR/tables.md sums them up at the end. The timing guard
(`specdec_jax.contention`) guards the project's shared CPU and is not used
here; rows say so. `--smoke` runs the same code at tiny sizes (one draft, fp32,
greedy at batch 2 and T=1 at batch 1) in well under a minute on a CPU: the test
suite runs it.

`--regime_map` runs, instead of those sections, the T5 regime map's sweep
(`specdec_jax.harness.regime_map` with `REGIME_MAP`'s settings: the public T5 shapes
to t5-3b in bfloat16 and our family, T_verify(k), c, the loops' own work and the encoders)
into OUT_DIR/regime_map, then its predictions and tables (`regime_predictions`), and its
figure where matplotlib is installed (elsewhere: `python -m experiments.regime_map
--nomeasure --output_dir=OUT_DIR/regime_map`). The shapes' checkpoints go to
`<data_dir>/regime_map_models` (t5-3b alone is 5.7 GB).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import sentencepiece as spm

from specdec_jax import atomic_io, benchmarking, checkpoints, contention, stats, theory
from specdec_jax.data import layout, prompts
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.harness import regime_map, regime_predictions
from specdec_jax.models.t5 import (
  PreparedParams,
  SharedEncoderModel,
  T5Config,
  T5Model,
  T5Scorer,
  make_draft,
  speculative_sample,
  temperature_sample,
)

Array = jax.Array

# The shipped drafts (`specdec_jax.harness.family.DRAFTS`), in the order measured:
# the smallest independent draft first (the CPU smoke test's), the drafts that agree with
# the target best next (the shared-encoder ones, the one distilled on the target's outputs).
DRAFTS = ("draft_small", "draft_shared_enc_d192", "draft_shared_enc_signals",
          "draft_shared_enc_long", "draft_shared_enc", "draft_small_kd", "draft_distilled",
          "draft_base", "draft_large")
TASK = "ende"
SEED = 0
RESULTS_FILE = "results.jsonl"
TABLES_FILE = "tables.md"
GUARD = ("not applicable (accelerator check): specdec_jax.contention guards timings on the "
         "project's shared CPU; rows of this script taken on a CPU are smoke output, not results")
# jax#40101 check: per-write time at the large buffer over the small one; an
# in-place write stays near 1.
WRITE_RATIO_LIMIT = 2.0
# cache_length check: step-time ratio allowed over the ratio of bytes read.
CACHE_RATIO_SLACK = 1.5


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one run measures (`FULL` or `SMOKE`).

  Attributes:
    drafts: shipped drafts (directories of the models dir), in the order measured.
    dtypes: compute and parameter dtypes ("float32", "bfloat16").
    batch_sizes: decoder batch sizes, each dividing `num_examples`.
    temperatures: sampling temperatures (0: greedy).
    gamma: draft proposals per target call.
    max_k: T_verify(k) is timed for k = 1..max_k (>= gamma + 1).
    num_examples: the first En-De test prompts decoded at every point.
    input_len: prompts are cut / 0-padded to this many tokens (EOS included).
    max_decode_len: most tokens generated per example.
    repetitions: timed passes over the examples per decoder (median used).
    timing_calls: calls per jitted loop when timing step costs.
    timing_repeats: timed runs of each such loop (median used).
    long_cache_len: cache positions of the cache-length check's long cache (the
      short one is the `target_step` timings': max_decode_len + max_k).
    write_bytes: (small, large) buffer sizes in bytes of the jax#40101 check.
    write_calls: writes per timed loop of the jax#40101 check.
    paired: decode points pair `batch_sizes[i]` with `temperatures[i]` instead
      of taking every combination (the smoke mode's two points).
    budget_s: a decode point is skipped (and a `skipped` row says so) when the
      run would pass this many seconds, counted from the start, by finishing
      it at the pace of the slowest point so far.
  """

  drafts: tuple[str, ...]
  dtypes: tuple[str, ...]
  batch_sizes: tuple[int, ...]
  temperatures: tuple[float, ...]
  gamma: int
  max_k: int
  num_examples: int
  input_len: int
  max_decode_len: int
  repetitions: int
  timing_calls: int
  timing_repeats: int
  long_cache_len: int
  write_bytes: tuple[int, int]
  write_calls: int
  paired: bool
  budget_s: float

  def __post_init__(self):
    if self.max_k < self.gamma + 1:
      raise ValueError(f"max_k={self.max_k} must be >= gamma + 1 = {self.gamma + 1}.")
    if self.long_cache_len <= self.max_decode_len + self.max_k:
      raise ValueError(f"long_cache_len={self.long_cache_len} must exceed max_decode_len + "
                       f"max_k = {self.max_decode_len + self.max_k}.")
    if self.paired and len(self.batch_sizes) != len(self.temperatures):
      raise ValueError(f"paired settings need as many batch sizes {self.batch_sizes} as "
                       f"temperatures {self.temperatures}.")
    if any(self.num_examples % b for b in self.batch_sizes):
      raise ValueError(f"num_examples={self.num_examples} must be a multiple of every batch "
                       f"size {self.batch_sizes}.")


FULL = Settings(
    drafts=DRAFTS, dtypes=("float32", "bfloat16"), batch_sizes=(1, 8), temperatures=(0.0, 1.0),
    gamma=3, max_k=8, num_examples=16, input_len=128, max_decode_len=64, repetitions=3,
    timing_calls=16, timing_repeats=5, long_cache_len=2048,
    write_bytes=(16 << 10, 16 << 20), write_calls=256, paired=False, budget_s=390.0)
SMOKE = Settings(
    drafts=DRAFTS[:1], dtypes=("float32",), batch_sizes=(2, 1), temperatures=(0.0, 1.0),
    gamma=2, max_k=3, num_examples=2, input_len=32, max_decode_len=8, repetitions=1,
    timing_calls=2, timing_repeats=1, long_cache_len=64, write_bytes=(1 << 10, 64 << 10),
    write_calls=8, paired=True, budget_s=600.0)


# `--regime_map`: the regime map's sweep on the accelerator, in the dtype it is used in there.
REGIME_MAP = regime_map.MapSettings(
    shapes=tuple(regime_map.SHAPES), dtype="bfloat16", param_dtype="bfloat16",
    timing_calls=16, timing_repeats=5, timing_rounds=5)
REGIME_MAP_DIR = "regime_map"


@dataclasses.dataclass(frozen=True)
class Point:
  """One decode point."""

  draft: str
  dtype: str
  batch_size: int
  temperature: float


def plan(settings: Settings) -> list[Point]:
  """Every decode point, the first draft's first (the order they are measured in)."""
  if settings.paired:
    pairs = list(zip(settings.batch_sizes, settings.temperatures, strict=True))
  else:
    pairs = [(b, t) for b in settings.batch_sizes for t in settings.temperatures]
  return [Point(d, dtype, b, t) for d in settings.drafts for dtype in settings.dtypes
          for b, t in pairs]


def fits_budget(elapsed_s: float, slowest_point_s: float, budget_s: float) -> bool:
  """Whether one more point, as slow as the slowest so far, ends within the budget."""
  return elapsed_s + slowest_point_s <= budget_s


class Recorder:
  """The rows of one run, each written as soon as it is added, and progress lines."""

  def __init__(self, output_dir: str):
    self.output_dir = output_dir
    self.rows: list[dict] = []
    self.start = time.perf_counter()

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def log(self, message: str) -> None:
    print(f"[{self.elapsed():6.1f} s] {message}", file=sys.stderr, flush=True)

  def add(self, row: dict) -> dict:
    """Stamps `row` with the seconds since the start and rewrites results.jsonl atomically."""
    row = {**row, "elapsed_s": round(self.elapsed(), 2)}
    self.rows.append(row)
    atomic_io.atomic_write_text(os.path.join(self.output_dir, RESULTS_FILE),
                                "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.rows))
    return row


def _git_revision() -> str | None:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=layout.REPO_ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def environment_row(settings: Settings, mode: str, prompts_source: str, models_dir: str) -> dict:
  """The `environment` row: where and with what the check ran."""
  return {
      "section": "environment", **benchmarking.environment(),
      "jaxlib": jaxlib.__version__, "flax": flax.__version__, "numpy": np.__version__,
      "devices": [str(d) for d in jax.devices()], "guard": GUARD, "mode": mode,
      "settings": dataclasses.asdict(settings), "prompts_source": prompts_source,
      "models_dir": models_dir, "command": " ".join(sys.argv), "git_revision": _git_revision(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def load_prompts(settings: Settings) -> tuple[np.ndarray, str]:
  """int32 `[num_examples, input_len]` tokenized En-De test inputs, and their file."""
  pairs, source = prompts.load_examples(TASK, prompts.PROMPTS_SPLIT, settings.num_examples)
  processor = spm.SentencePieceProcessor(model_file=prompts.VOCAB_PATH)
  return prompts.tokenize(processor, [x for x, _ in pairs], settings.input_len), source


def load_model(models_dir: str, name: str, dtype: str
               ) -> tuple[T5Model | SharedEncoderModel, PreparedParams]:
  """A shipped model in `dtype` (weights and compute), its weights prepared on the device."""
  model, params = checkpoints.load_model(os.path.join(models_dir, name), dtype=dtype,
                                         param_dtype=dtype)
  return model, model.prepare(jax.device_put(params))


# --- jax#40101: small writes into large buffers inside a loop -------------------------------


@functools.partial(jax.jit, static_argnames=("axis", "calls"), donate_argnums=0)
def write_loop(buffer: Array, update: Array, *, axis: int, calls: int) -> Array:
  """Writes `update` into `buffer` `calls` times, at positions 0, 1, ... of `axis` (wrapping).

  Args:
    buffer: any shape, donated: the loop may update it in place.
    update: `buffer`'s shape with one position on `axis`.
    axis: the position axis.
    calls: writes (loop iterations).

  Returns:
    The buffer after the writes.
  """
  slots = buffer.shape[axis] - update.shape[axis] + 1

  def body(i: Array, buf: Array) -> Array:
    index = [jnp.zeros((), jnp.int32)] * buf.ndim
    index[axis] = (i % slots).astype(jnp.int32)
    return jax.lax.dynamic_update_slice(buf, update, tuple(index))

  return jax.lax.fori_loop(0, calls, body, buffer)


def write_cases(draft: T5Config, dtype: str) -> dict[str, tuple[tuple[int, ...], str, int]]:
  """Our smallest loop writes at batch 1: name -> (update shape, dtype, position axis).

  The baseline writes one int32 token per step into `[batch, max_decode_len]`;
  a draft layer writes one position of keys `[heads, d_kv, 1]` and values
  `[heads, 1, d_kv]` into its cache (`kernels.DecoderCache` layouts).
  """
  heads, d_kv = draft.num_heads, draft.d_kv
  return {"token": ((1, 1), "int32", 1),
          "draft_key_cache": ((heads, d_kv, 1), dtype, 2),
          "draft_value_cache": ((heads, 1, d_kv), dtype, 1)}


def seconds_per_write(device: jax.Device, shape: tuple[int, ...], dtype: str, axis: int,
                      length: int, calls: int, repeats: int) -> tuple[float, float]:
  """(median seconds per write, compile seconds) of `write_loop` on a buffer of `length`."""
  update = jnp.ones(shape, dtype, device=device)
  buffer_shape = list(shape)
  buffer_shape[axis] = length
  state = [jnp.zeros(buffer_shape, dtype, device=device)]

  def call() -> Array:
    state[0] = write_loop(state[0], update, axis=axis, calls=calls)
    return state[0]

  timing = benchmarking.time_calls(call, repeats)
  return timing.median_s / calls, timing.compile_s


def check_jax_40101(rec: Recorder, settings: Settings, draft: T5Config) -> None:
  """One `jax_40101` row per backend (the default one and the CPU) and write case."""
  dtype = min(settings.dtypes, key=lambda d: jnp.dtype(d).itemsize)
  backends = dict.fromkeys([jax.default_backend(), "cpu"])
  for backend in backends:
    device = jax.devices(backend)[0]
    for name, (shape, case_dtype, axis) in write_cases(draft, dtype).items():
      position_bytes = int(np.prod(shape)) * jnp.dtype(case_dtype).itemsize
      lengths = [max(b // position_bytes, 2) for b in settings.write_bytes]
      (small_s, small_compile_s), (large_s, large_compile_s) = (seconds_per_write(
          device, shape, case_dtype, axis, n, settings.write_calls, settings.timing_repeats)
          for n in lengths)
      ratio = large_s / small_s
      rec.add({
          "section": "jax_40101", "backend": backend, "device_kind": device.device_kind,
          "write": name, "update_shape": list(shape), "dtype": case_dtype,
          "update_bytes": position_bytes, "buffer_lengths": lengths,
          "buffer_bytes": [n * position_bytes for n in lengths],
          "seconds_per_write": [small_s, large_s], "compile_s": small_compile_s + large_compile_s,
          "calls": settings.write_calls, "repeats": settings.timing_repeats, "ratio": ratio,
          "ratio_limit": WRITE_RATIO_LIMIT,
          "verdict": "pass" if ratio < WRITE_RATIO_LIMIT else "warn"})
      rec.log(f"jax#40101 {backend} {name} ({position_bytes} B): {1e6 * small_s:.2f} -> "
              f"{1e6 * large_s:.2f} us/write at {lengths[0]} -> {lengths[1]} positions "
              f"({ratio:.2f}X)")


# --- Target step costs ------------------------------------------------------------------------


def _tree_bytes(tree: Any) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def step_geometry(settings: Settings) -> tuple[int, int]:
  """(cache_len, position) of the `target_step` timings: chunks scored halfway in."""
  return settings.max_decode_len + settings.max_k, settings.max_decode_len // 2


def measure_target_steps(rec: Recorder, settings: Settings, target: T5Model,
                         params: PreparedParams, inputs: Array) -> dict[int, float]:
  """The `target_step` row of one dtype and batch size; returns {k: seconds per call}."""
  cache_len, position = step_geometry(settings)
  times = benchmarking.target_step_times(
      T5Scorer(target, params), inputs, chunk_lengths=range(1, settings.max_k + 1),
      cache_len=cache_len,
      position=position, calls=settings.timing_calls, repeats=settings.timing_repeats)
  t_chunk = {k: t.seconds for k, t in times.items()}
  row = rec.add({
      "section": "target_step", "model": "target", "dtype": target.config.dtype,
      "batch_size": int(inputs.shape[0]), "t_step_s": t_chunk[1],
      "t_verify_s": {str(k): t for k, t in t_chunk.items()},
      "verify_ratio": {str(k): t / t_chunk[1] for k, t in t_chunk.items()},
      "compile_s": sum(t.compile_s for t in times.values()), "cache_len": cache_len,
      "position": position, "calls": settings.timing_calls, "repeats": settings.timing_repeats})
  rec.log(f"target {row['dtype']} batch {row['batch_size']}: T_step {1e3 * t_chunk[1]:.3f} ms, "
          "T_verify(k)/T_step " + " ".join(f"{r:.2f}" for r in row["verify_ratio"].values()))
  return t_chunk


def check_cache_length(rec: Recorder, settings: Settings, target: T5Model,
                       params: PreparedParams, inputs: Array, t_step: float) -> None:
  """The `cache_length` row: T_step at `long_cache_len` against the decoders' cache.

  Args:
    rec: the run's recorder.
    settings: the run's settings.
    target: the target.
    params: its prepared weights.
    inputs: int32 `[batch, input_len]`, the batch `t_step` was measured at.
    t_step: the `target_step` section's T_step (cache of `step_geometry()[0]`).
  """
  cfg = target.config
  cache_len, position = step_geometry(settings)
  lengths = [cache_len, settings.long_cache_len]
  long_step = benchmarking.target_step_times(
      T5Scorer(target, params), inputs, chunk_lengths=[1], cache_len=settings.long_cache_len,
      position=position, calls=settings.timing_calls, repeats=settings.timing_repeats)[1]
  batch = int(inputs.shape[0])
  kv_bytes = [2 * cfg.num_decoder_layers * batch * cfg.num_heads * cfg.d_kv * n
              * cfg.compute_dtype.itemsize for n in lengths]
  weight_bytes = _tree_bytes(params.decoder)
  bytes_ratio = (weight_bytes + kv_bytes[1]) / (weight_bytes + kv_bytes[0])
  ratio = long_step.seconds / t_step
  rec.add({
      "section": "cache_length", "model": "target", "dtype": cfg.dtype, "batch_size": batch,
      "cache_lengths": lengths, "position": position, "t_step_s": [t_step, long_step.seconds],
      "compile_s": long_step.compile_s, "decoder_weight_bytes": weight_bytes,
      "kv_cache_bytes": kv_bytes, "bytes_ratio": bytes_ratio, "ratio": ratio,
      "ratio_limit": CACHE_RATIO_SLACK * bytes_ratio,
      "verdict": "pass" if ratio <= CACHE_RATIO_SLACK * bytes_ratio else "warn"})
  rec.log(f"cache length {lengths[0]} -> {lengths[1]}: T_step {1e3 * t_step:.3f} -> "
          f"{1e3 * long_step.seconds:.3f} ms ({ratio:.2f}X; bytes read {bytes_ratio:.2f}X)")


# --- Baseline vs speculative (`benchmarking.time_interleaved`) ------------------------------


def greedy_mismatches(baseline: Sequence[Any],
                      speculative: Sequence[Any]) -> tuple[int, str | None]:
  """Rows whose speculative tokens or length differ from the baseline's, and the first such.

  Args:
    baseline: per batch, a fetched `DecodeOutput` (`sequences [batch, max_decode_len]`).
    speculative: per batch, the fetched `SpeculativeOutput` of the same inputs.
  """
  count, first = 0, None
  for i, (b, s) in enumerate(zip(baseline, speculative, strict=True)):
    rows = np.flatnonzero(np.any(b.sequences != s.sequences, axis=1) | (b.lengths != s.lengths))
    count += rows.size
    if rows.size and first is None:
      row = rows[0]
      col = int(np.argmax(b.sequences[row] != s.sequences[row]))
      first = (f"batch {i} row {row} token {col}: baseline "
               f"{b.sequences[row, col:col + 5].tolist()}, speculative "
               f"{s.sequences[row, col:col + 5].tolist()}")
  return count, first


def decode_row(settings: Settings, point: Point, timings: dict[str, benchmarking.DecoderTiming],
               outputs: dict[str, list], draft_cost: benchmarking.StepTimes,
               t_chunk: dict[int, float]) -> dict:
  """The `decode` row of one point from its measurements."""
  tokens = {name: int(sum(int(np.sum(o.lengths)) for o in outs))
            for name, outs in outputs.items()}
  ms_per_token = {name: 1e3 * timings[name].median_s / max(tokens[name], 1) for name in timings}
  pooled = stats.Pooled.of(outputs["speculative"])
  alpha_beta = pooled.alpha_beta()
  t_step = t_chunk[1]
  cost_model = theory.CostModel(t_step, draft_cost.seconds, t_chunk)
  c = stats.draft_cost(draft_cost.seconds, t_step)
  greedy = point.temperature == 0
  mismatched, first_difference = greedy_mismatches(outputs["baseline"], outputs["speculative"])
  return {
      "section": "decode", "task": TASK, **dataclasses.asdict(point), "gamma": settings.gamma,
      "num_examples": settings.num_examples, "input_len": settings.input_len,
      "max_decode_len": settings.max_decode_len, "repetitions": settings.repetitions,
      "seed": SEED,
      **{f"{name}_s": list(t.totals_s) for name, t in timings.items()},
      **{f"{name}_median_s": t.median_s for name, t in timings.items()},
      **{f"{name}_compile_s": t.compile_s for name, t in timings.items()},
      **{f"{name}_tokens": n for name, n in tokens.items()},
      **{f"{name}_ms_per_token": ms for name, ms in ms_per_token.items()},
      "speedup_measured": ms_per_token["baseline"] / ms_per_token["speculative"],
      "speedup_walltime_ratio": timings["baseline"].median_s / timings["speculative"].median_s,
      "alpha_empirical": pooled.alpha_empirical(),
      "alpha_beta": alpha_beta, "accepted": int(pooled["accepted"]),
      "rejections": int(pooled["rejections"]), "iterations": int(pooled["iterations"]),
      "tokens_per_iteration": pooled.tokens_per_call(),
      "accepted_histogram": pooled["accepted_histogram"].astype(int).tolist(),
      "t_target_step_s": t_step, "t_draft_token_s": draft_cost.seconds, "c": c,
      "draft_timing_compile_s": draft_cost.compile_s,
      "speedup_predicted_thm38": float(theory.walltime_improvement(alpha_beta, settings.gamma, c)),
      "speedup_predicted_cost_model": float(cost_model.expected_speedup(alpha_beta,
                                                                        settings.gamma)),
      "greedy_identical": mismatched == 0 if greedy else None,
      "greedy_mismatched_rows": mismatched if greedy else None,
      "greedy_first_difference": first_difference if greedy else None,
      "guard": GUARD}


def measure_point(settings: Settings, point: Point, target: T5Model, params: PreparedParams,
                  draft: Draft, batches: Sequence[Array], t_chunk: dict[int, float]) -> dict:
  """Times both decoders over `batches` and the draft's cost; returns the `decode` row.

  Args:
    settings: the run's settings.
    point: the point.
    target: the target model (in `point.dtype`).
    params: its prepared weights.
    draft: the draft (in `point.dtype`).
    batches: int32 `[point.batch_size, input_len]` input batches.
    t_chunk: {k: seconds per k-token target call} at this dtype and batch size.
  """
  rngs = [jax.random.fold_in(jax.random.PRNGKey(SEED), i) for i in range(len(batches))]
  kwargs = dict(max_decode_len=settings.max_decode_len, temperature=point.temperature)
  decoders = {
      "baseline": lambda i: temperature_sample(target, params, batches[i], rng=rngs[i], **kwargs),
      "speculative": lambda i: speculative_sample(target, params, draft, batches[i],
                                                  gamma=settings.gamma, rng=rngs[i], **kwargs)}
  timings, outputs = benchmarking.time_interleaved(decoders, len(batches), settings.repetitions)
  draft_cost = benchmarking.draft_token_time(
      draft, batches[0], gamma=settings.gamma, warp=Warp(point.temperature),
      cache_len=settings.max_decode_len + settings.gamma + 1,
      position=settings.max_decode_len // 2, calls=settings.timing_calls,
      repeats=settings.timing_repeats, seed=SEED,
      target_encoded=benchmarking.target_encoded_for(draft, T5Scorer(target, params),
                                                     batches[0]))
  return decode_row(settings, point, timings, outputs, draft_cost, t_chunk)


# --- The run ----------------------------------------------------------------------------------


def run(settings: Settings, output_dir: str, models_dir: str, mode: str) -> list[dict]:
  """Measures every section in order; returns the rows (also in `output_dir`)."""
  rec = Recorder(output_dir)
  tokens, source = load_prompts(settings)
  env = rec.add(environment_row(settings, mode, source, models_dir))
  rec.log(f"jax {env['jax']} ({env['backend']}: {env['device_kind']}), {mode} mode, "
          f"{len(tokens)} prompts from {source}")
  models: dict[tuple[str, str], tuple[T5Model, PreparedParams]] = {}

  def model(name: str, dtype: str) -> tuple[T5Model, PreparedParams]:
    if (name, dtype) not in models:
      models[(name, dtype)] = load_model(models_dir, name, dtype)
    return models[(name, dtype)]

  batches = {b: [jnp.asarray(x) for x in np.split(tokens, len(tokens) // b)]
             for b in settings.batch_sizes}
  check_jax_40101(rec, settings, model(settings.drafts[0], settings.dtypes[0])[0].config)
  t_chunk = {(dtype, b): measure_target_steps(rec, settings, *model("target", dtype),
                                              batches[b][0])
             for dtype in settings.dtypes for b in settings.batch_sizes}
  first = (settings.dtypes[0], settings.batch_sizes[0])
  check_cache_length(rec, settings, *model("target", first[0]), batches[first[1]][0],
                     t_chunk[first][1])
  slowest = 0.0
  for point in plan(settings):
    if not fits_budget(rec.elapsed(), slowest, settings.budget_s):
      rec.add({"section": "skipped", **dataclasses.asdict(point), "gamma": settings.gamma,
               "reason": f"time budget: {rec.elapsed():.0f} s elapsed, the slowest point took "
                         f"{slowest:.0f} s, budget {settings.budget_s:.0f} s"})
      rec.log(f"skipped {point} (time budget)")
      continue
    began = time.perf_counter()
    draft_model, draft_params = model(point.draft, point.dtype)
    try:
      row = rec.add(measure_point(settings, point, *model("target", point.dtype),
                                  make_draft(draft_model, draft_params), batches[point.batch_size],
                                  t_chunk[(point.dtype, point.batch_size)]))
    except Exception as e:  # One failing point must not cost the others theirs.
      rec.add({"section": "error", **dataclasses.asdict(point), "gamma": settings.gamma,
               "error": f"{type(e).__name__}: {e}"})
      rec.log(f"FAILED {point}: {type(e).__name__}: {e}")
      continue
    finally:
      slowest = max(slowest, time.perf_counter() - began)
    rec.log(f"{point.draft} {point.dtype} batch {point.batch_size} T={point.temperature:g}: "
            f"{row['baseline_ms_per_token']:.3f} -> {row['speculative_ms_per_token']:.3f} "
            f"ms/token, speedup {row['speedup_measured']:.2f}X, alpha {row['alpha_beta']:.2f}, "
            f"c {row['c']:.3f}, {row['tokens_per_iteration']:.2f} tokens/call")
  return rec.rows


def tables(rows: list[dict]) -> str:
  """Markdown summary of a run's rows."""
  env = next(r for r in rows if r["section"] == "environment")
  lines = [f"# Device check ({env['mode']}): {env['device_kind']} ({env['backend']}), jax "
           f"{env['jax']} / jaxlib {env['jaxlib']}, {env['date']}", "",
           f"Command: `{env['command']}`. Guard: {env['guard']}.", "",
           "## jax#40101: seconds per small write, small vs large buffer", "",
           "| backend | write | update bytes | small us | large us | ratio | verdict |",
           "|---|---|---|---|---|---|---|"]
  lines += [f"| {r['backend']} | {r['write']} | {r['update_bytes']} | "
            f"{1e6 * r['seconds_per_write'][0]:.3f} | {1e6 * r['seconds_per_write'][1]:.3f} | "
            f"{r['ratio']:.2f} | {r['verdict']} |" for r in rows if r["section"] == "jax_40101"]
  for r in (r for r in rows if r["section"] == "cache_length"):
    lines += ["", f"Cache length {r['cache_lengths'][0]} -> {r['cache_lengths'][1]}: T_step "
              f"{r['ratio']:.2f}X, bytes read {r['bytes_ratio']:.2f}X: {r['verdict']}."]
  steps = [r for r in rows if r["section"] == "target_step"]
  ks = [k for k in steps[0]["verify_ratio"] if k != "1"] if steps else []
  lines += ["", "## Target: T_step and T_verify(k) / T_step", "",
            "| dtype | batch | T_step ms | " + " | ".join(f"k={k}" for k in ks) + " |",
            "|---|---|---|" + "---|" * len(ks)]
  lines += [f"| {r['dtype']} | {r['batch_size']} | {1e3 * r['t_step_s']:.3f} | "
            + " | ".join(f"{r['verify_ratio'][k]:.2f}" for k in ks) + " |" for r in steps]
  lines += ["", "## Baseline vs speculative", "",
            "| draft | dtype | batch | T | gamma | base ms/tok | spec ms/tok | speedup | "
            "alpha (beta) | alpha (S/(S+R)) | c | tokens/call | Thm 3.8 | cost model | "
            "greedy identical |", "|" + "---|" * 15]
  lines += [f"| {r['draft']} | {r['dtype']} | {r['batch_size']} | {r['temperature']:g} | "
            f"{r['gamma']} | {r['baseline_ms_per_token']:.3f} | "
            f"{r['speculative_ms_per_token']:.3f} | **{r['speedup_measured']:.2f}X** | "
            f"{r['alpha_beta']:.3f} | {r['alpha_empirical']:.3f} | {r['c']:.3f} | "
            f"{r['tokens_per_iteration']:.2f} | {r['speedup_predicted_thm38']:.2f}X | "
            f"{r['speedup_predicted_cost_model']:.2f}X | "
            f"{'-' if r['greedy_identical'] is None else r['greedy_identical']} |"
            for r in rows if r["section"] == "decode"]
  lines += [f"\nFailed: {r['draft']} {r['dtype']} b{r['batch_size']} T={r['temperature']:g}: "
            f"{r['error']}" for r in rows if r["section"] == "error"]
  skipped = [r for r in rows if r["section"] == "skipped"]
  if skipped:
    lines += ["", f"Skipped ({skipped[0]['reason']}): "
              + "; ".join(f"{r['draft']} {r['dtype']} b{r['batch_size']} T={r['temperature']:g}"
                          for r in skipped) + "."]
  return "\n".join(lines) + "\n"


def run_regime_map(output_dir: str, settings: regime_map.MapSettings = REGIME_MAP) -> str:
  """The regime map's sweep into `<output_dir>/regime_map`: rows, predictions, tables, and the
  figure where matplotlib is installed; returns the tables' text.

  The timing guard watches the project's shared CPU; here it is recorded, not enforced
  (each row's `idle_check` says `"enforced": false`).
  """
  os.environ[contention.GUARD_ENV] = "off"
  out = os.path.join(output_dir, REGIME_MAP_DIR)
  rows = regime_map.run(settings, out)
  report = regime_predictions.write_report(rows, settings, regime_predictions.MapPredictions(),
                                           out, " ".join(sys.argv))
  try:
    from specdec_jax.harness import regime_figure  # noqa: PLC0415  (needs matplotlib)
  except ImportError:
    print(f"No matplotlib here: draw the figure with python -m experiments.regime_map "
          f"--nomeasure --output_dir={out}", file=sys.stderr)
  else:
    regime_figure.fig_regime_map(report["predictions"], report["family_errors"],
                                 report["last_level_cache"], os.path.join(out, "regime_map.png"))
  with open(os.path.join(out, regime_predictions.TABLES_FILE), encoding="utf-8") as f:
    return f.read()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m experiments.device_check",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--output_dir", required=True,
                      help=f"Where {RESULTS_FILE} and {TABLES_FILE} go (replaced).")
  parser.add_argument("--smoke", action="store_true",
                      help="Tiny sizes (one draft, fp32, two points): the test suite's run.")
  parser.add_argument("--models_dir", default=os.path.join(layout.ASSETS_DIR, "models"),
                      help="The shipped family: target and drafts in HF T5 format.")
  parser.add_argument("--regime_map", action="store_true",
                      help="Instead of the check's sections, the T5 regime map's sweep "
                           f"(REGIME_MAP's settings) into OUTPUT_DIR/{REGIME_MAP_DIR} "
                           "(--smoke and --budget_s do not apply to it).")
  parser.add_argument("--budget_s", type=float, default=None,
                      help="Time budget: a decode point that would end later than this many "
                           "seconds after the start is skipped (default "
                           f"{FULL.budget_s:g} full, {SMOKE.budget_s:g} smoke).")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
  args = parse_args(argv)
  if args.regime_map:
    print(run_regime_map(args.output_dir,
                         dataclasses.replace(REGIME_MAP, models_dir=args.models_dir)))
    return
  settings = SMOKE if args.smoke else FULL
  if args.budget_s is not None:
    settings = dataclasses.replace(settings, budget_s=args.budget_s)
  rows = run(settings, args.output_dir, args.models_dir, "smoke" if args.smoke else "full")
  text = tables(rows)
  atomic_io.atomic_write_text(os.path.join(args.output_dir, TABLES_FILE), text)
  print(text)
  print(f"{len(rows)} rows in {os.path.join(args.output_dir, RESULTS_FILE)}.")


if __name__ == "__main__":
  main()
