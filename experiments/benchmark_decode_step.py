r"""One decoder call of k tokens, round 1's decode path against today's, side by side.

For the target and each draft of the shipped family, times T_step (k = 1) and
T_verify(k) (k = 2..8): the seconds of one cached `decode_chunk` call scoring k
tokens per row, inside a jitted loop of `--calls` calls (no Python per call),
halfway into a `Settings.max_decode_len` generation. Three paths:

  round1:   the model code of git revision `--round1_ref` (the T5X-layout tree
            read by the Flax modules on every call, keys/values `[batch, len,
            heads, d_kv]`, XLA's default dot libraries), loaded from git;
  xla_dots: `T5Model.prepare` once, then `cached_decoder` (fused projections,
            dot-friendly cache layouts, the loops' compiler options) with
            XLA's weight products (`DecodeOptions.weight_kernel="xla"`; calls
            of up to `row_dots_max_rows` rows multiplied row by row);
  f32_panels: the same with the weights packed for `panel_dot` as float32 panels
            (`DecodeOptions.half_panels` off);
  new:      `DecodeOptions.for_backend()`: panels in float16 where that holds the
            weights exactly (the shipped checkpoints are float16), half the bytes
            per call.

each on both cores and pinned to one (`os.sched_setaffinity` on every thread of
the process). All combinations are interleaved within each repetition; medians
over `--repetitions`; the first call of every program (compilation) is timed
apart. The whole measurement runs inside a `contention.Guard`: our registered
jobs are paused, and nothing is written unless the machine stayed quiet.

  python -m experiments.benchmark_decode_step [--output_dir=results/decode_step]

The models directory and the input and generation lengths are the shared
`Settings` (gin).

Writes `results.jsonl` (a row per model, path, cores and k) and `tables.md`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specdec_jax import atomic_io, benchmarking, contention
from specdec_jax.checkpoints import load_hf_checkpoint
from specdec_jax.data import layout
from specdec_jax.harness import family, gin_flags, settings
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import T5Context, T5Model, T5Scorer

_MODELS = flags.DEFINE_list(
    "models", [m for m in family.FAMILY if m not in family.SHARED_ENCODER],
    "Members to time (T5 encoder-decoders; a shared-encoder draft has no encoder of its own).")
_ROUND1_REF = flags.DEFINE_string("round1_ref", "c7823d4",
                                  "Git revision whose specdec_jax/models/ is the round-1 path.")
_MAX_K = flags.DEFINE_integer("max_k", 8, "Largest chunk length timed.", lower_bound=1)
_CALLS = flags.DEFINE_integer("calls", 16, "decode_chunk calls per timed loop.", lower_bound=1)
_REPETITIONS = flags.DEFINE_integer("repetitions", 7, "Timed runs of every loop (median used).",
                                    lower_bound=1)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", os.path.join("results", "decode_step"),
                                  "Where results.jsonl and tables.md go.")

PATHS = ("round1", "xla_dots", "f32_panels", "new")
CORES = (2, 1)


def load_round1_models(ref: str) -> ModuleType:
  """`specdec_jax/models/{config,layers,t5}.py` of git revision `ref`, as a package.

  Raises:
    ValueError: `ref` is not a revision of this repository (or git is missing).
  """
  package = f"round1_models_{ref}"
  if package in sys.modules:
    return sys.modules[f"{package}.t5"]
  root = tempfile.mkdtemp(prefix="specdec_round1_")
  os.makedirs(os.path.join(root, package))
  for name in ("__init__", "config", "layers", "t5"):
    try:
      source = "" if name == "__init__" else subprocess.run(
          ["git", "show", f"{ref}:specdec_jax/models/{name}.py"], cwd=layout.REPO_ROOT,
          check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
      raise ValueError(f"--round1_ref={ref!r}: cannot read specdec_jax/models/{name}.py from "
                       f"git ({e}); pass a revision of this repository.") from e
    with open(os.path.join(root, package, f"{name}.py"), "w") as f:
      f.write(source.replace("specdec_jax.models", package))
  sys.path.insert(0, root)
  return importlib.import_module(f"{package}.t5")


def pin_to_cores(n: int) -> None:
  """Restricts every thread of this process to the first `n` cores."""
  cores = set(sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))[:n])
  for tid in os.listdir("/proc/self/task"):
    os.sched_setaffinity(int(tid), cores)


@functools.partial(jax.jit, static_argnames=("model", "cache_len", "calls"))
def _round1_loop(model, params: dict, encoded, tokens: jax.Array, start: jax.Array, *,
                 cache_len: int, calls: int) -> jax.Array:
  """Round 1's timing loop (`benchmarking.chunk_loop` as it was): T5X tree every call."""

  def body(_, carry):
    cache, acc = carry
    logits, cache = model.decode_chunk(params, encoded, cache.rewind(start), tokens)
    return cache, acc + logits[:, -1, 0].sum()

  cache = model.init_cache(tokens.shape[0], cache_len).rewind(start)
  return jax.lax.fori_loop(0, calls, body, (cache, jnp.zeros((), jnp.float32)))[1]


def _path_models(new: T5Model) -> dict[str, T5Model]:
  """The model of each of today's paths: `new`, and copies whose options differ."""
  return {"new": new,
          "xla_dots": dataclasses.replace(new, options=new.options.replace(
              weight_kernel="xla", half_panels=False)),
          "f32_panels": dataclasses.replace(new, options=new.options.replace(
              half_panels=False))}


def _loops(model_dir: str, round1: ModuleType, inputs: jax.Array, cache_len: int,
           position: int) -> dict[tuple[str, int], callable]:
  """(path, k) -> a function of no arguments running one timed loop."""
  cfg, params = load_hf_checkpoint(model_dir)
  params = jax.device_put(params)
  old_cfg = round1.T5Config(**{k: getattr(cfg, k) for k in round1.T5Config.__dataclass_fields__})
  old = round1.T5Model(old_cfg)
  old_encoded = old.encode(params, inputs)
  new = T5Model(cfg)
  new_encoded = new.encode(params, inputs)
  # Each path's weights are in its state's context; `score` never reads the scorer's own.
  scorers = {path: T5Scorer(model, {}) for path, model in _path_models(new).items()}
  states = {path: benchmarking.initial_state(
      scorer, T5Context(scorer.model.prepare(params).decoder, new_encoded), cache_len)
            for path, scorer in scorers.items()}
  start = jnp.full((inputs.shape[0],), position, jnp.int32)
  loops = {}
  for k in range(1, _MAX_K.value + 1):
    tokens = jnp.ones((inputs.shape[0], k), jnp.int32)
    loops[("round1", k)] = functools.partial(
        _round1_loop, old, params, old_encoded, tokens, start, cache_len=cache_len,
        calls=_CALLS.value)
    for path, state in states.items():
      loops[(path, k)] = functools.partial(benchmarking.chunk_loop, scorers[path], state,
                                           tokens, start, calls=_CALLS.value)
  return loops


def measure(shared: settings.Settings) -> tuple[list[dict], dict]:
  """Times every (model, path, cores, k); returns the rows and the guard's record.

  Args:
    shared: the models directory, the encoder length and the generation length (the
      cache has max_decode_len + max_k positions, chunks are scored at
      max_decode_len // 2).
  """
  round1 = load_round1_models(_ROUND1_REF.value)
  rng = np.random.RandomState(0)
  inputs = jnp.asarray(rng.randint(5, 8000, (1, shared.input_len)), jnp.int32)
  cache_len = shared.max_decode_len + _MAX_K.value
  position = shared.max_decode_len // 2
  loops = {}
  for name in _MODELS.value:
    for key, fn in _loops(shared.checkpoint_dir(name), round1, inputs, cache_len,
                          position).items():
      loops[(name,) + key] = fn
  times: dict[tuple, list[float]] = {}
  first: dict[tuple, float] = {}
  with contention.quiet("benchmark_decode_step") as guard:
    for cores in CORES:  # Compile (and time the first call) on the machine as it is.
      pin_to_cores(cores)
      for key, fn in loops.items():
        if key not in first:
          first[key] = benchmarking.timed(fn)[0]
    for _ in range(_REPETITIONS.value):
      for cores in CORES:
        pin_to_cores(cores)
        for key, fn in loops.items():
          times.setdefault(key + (cores,), []).append(benchmarking.timed(fn)[0])
    pin_to_cores(max(CORES))
  record = guard.record()
  date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  # The `new` path's options.
  environment = benchmarking.environment(DecodeOptions.for_backend().provenance())
  rows = []
  for (name, path, k, cores), ts in times.items():
    per_call = statistics.median(ts) / _CALLS.value
    step = statistics.median(times[(name, path, 1, cores)]) / _CALLS.value
    rows.append({
        "model": name, "path": path, "cores": cores, "k": k, "batch_size": 1,
        "seconds": per_call, "ratio_to_step": per_call / step,
        "times_s": ts, "calls": _CALLS.value, "repetitions": _REPETITIONS.value,
        "compile_s": max(first[(name, path, k)] - statistics.median(ts), 0.0),
        "input_len": shared.input_len, "cache_len": cache_len, "position": position,
        "round1_ref": _ROUND1_REF.value, "idle_check": record, "environment": environment,
        "date": date})
  return rows, record


def table(rows: list[dict]) -> str:
  """Markdown: per model and cores, T_step and T_verify(k)/T_step of both paths."""
  by = {(r["model"], r["path"], r["cores"], r["k"]): r["seconds"] for r in rows}
  models = list(dict.fromkeys(r["model"] for r in rows))
  ks = sorted({r["k"] for r in rows})
  head = ("| model | cores | path | T_step ms | " + " | ".join(f"k={k}" for k in ks[1:])
          + " | step speedup over round1 |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for model in models:
    for cores in CORES:
      for path in PATHS:
        step = by[(model, path, cores, 1)]
        speedup = by[(model, "round1", cores, 1)] / step
        lines.append(
            f"| {model} | {cores} | {path} | {1e3 * step:.2f} | "
            + " | ".join(f"{by[(model, path, cores, k)] / step:.2f}" for k in ks[1:])
            + (f" | {speedup:.2f}X |" if path != "round1" else " | |"))
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  start = time.perf_counter()
  shared = settings.load_settings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  rows, record = measure(shared)
  out = _OUTPUT_DIR.value
  atomic_io.atomic_write_text(os.path.join(out, "results.jsonl"),
                              "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
  text = table(rows)
  env = rows[0]["environment"]
  atomic_io.atomic_write_text(os.path.join(out, "tables.md"), (
      f"# One decoder call of k tokens (batch 1, fp32), {env['cpu_model']} x "
      f"{env['cpu_count']}, jax {env['jax']}\n\nT_step in ms; k=2..: T_verify(k) / T_step of "
      f"the same path and cores. Weight products of `new`: {env['weight_dots']}. Idle "
      f"check: other processes {record['other_cores_before']:.2f}"
      f" / {record['other_cores_after']:.2f} cores, calibration "
      f"{record['calibration_ms_before']:.1f} / {record['calibration_ms_after']:.1f} ms "
      f"before / after.\nCommand: python -m experiments.benchmark_decode_step\n\n{text}"))
  print(text)
  print(f"{len(rows)} rows in {out} ({time.perf_counter() - start:.0f} s).")


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
