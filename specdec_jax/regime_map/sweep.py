"""The T5 regime map's measurements: the paper's shapes and our family, priced on this machine.

Every cost in the cost model can be measured without trained weights. This module builds
random-weight T5 models from the public configs (`SHAPES`: t5-small / base / large and
their T5.1.1 shapes, which are the paper's drafts; t5-3b), saves each in float16 with
`checkpoints.save_hf_checkpoint` and loads it back with `checkpoints.load_hf_checkpoint`,
the path a user's checkpoint takes, and measures our shipped family (`assets/models`) the
same way in the same run. Two kinds of row:

  model  one per shape and for our target: T_step and T_verify(k), k = 1..max_gamma + 1
         (`timing.verify_times`: rounds, T_step's median, each k's fastest round), the
         encoder at a `prompt_len`-token prompt, the decoder's bytes per call.
  pair   one per (draft, target, temperature): the draft's seconds per proposed token
         (`timing.draft_time`, c = T_draft / T_step); for our family's pairs also both
         loops' own work and both encoders (`timing.measure_loop_costs`, the
         speculative loop at `draft_gamma` and at `timing.second_gamma`'s;
         `measure_pair` says why a shape's pair borrows them).

Alpha is the one term that needs trained weights; `regime_predictions` takes it from the
paper and from our committed rows. The rows (`regime_rows.ModelRow`, `regime_rows.PairRow`)
go to `<output_dir>/rows.jsonl`, each appended atomically as soon as it is measured
(`results_io.append_row`); a run measures only the keys missing there (`pending`), so an
interrupted run resumes. Every timing runs inside the guard (`contention.quiet`; a refused
one is measured again once the machine is quiet), compilation is timed apart from the
medians, and the compiled programs are dropped after each row. No gin and no matplotlib:
the device check runs this module.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from specdec_jax import contention, validation
from specdec_jax.costs import gamma_choice, timing
from specdec_jax.data import layout, prompts
from specdec_jax.decoding import buckets, programs
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment import results_io
from specdec_jax.models.layers import ParamInfo
from specdec_jax.models.t5 import (
  DecodeWeights,
  PreparedParams,
  SharedEncoderModel,
  T5Config,
  T5Model,
  T5Scorer,
  get_config,
  make_draft,
)
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_model, save_hf_checkpoint
from specdec_jax.regime_map import regime_rows
from specdec_jax.regime_map.regime_rows import ModelRow, PairRow
from specdec_jax.theory import LoopCosts

Array = jax.Array

ROWS_FILE = "rows.jsonl"
TASK = "ende"  # The prompt every model encodes is cut from this task's committed inputs.
# The parameter count of each public HuggingFace checkpoint whose shape we build. The paper
# (Sec. 4.1) used the T5.1.1 shapes (77M, 250M, 800M drafts); the T5 paper rounds t5-large to
# "770M", but its checkpoint holds 737.7M (the tied embedding counted once).
SHAPES: dict[str, int] = {
    "t5-small": 60_506_624,
    "t5-base": 222_903_552,
    "t5-large": 737_668_096,
    "t5-3b": 2_851_598_336,
    "t5-v1_1-small": 76_961_152,
    "t5-v1_1-base": 247_577_856,
    "t5-v1_1-large": 783_150_080,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MapSettings:
  """What one regime-map run measures, and how long it times each thing.

  Attributes:
    shapes: public T5 shapes (keys of `SHAPES`) built with random weights; each drafts
      every larger shape of its architecture (T5 v1.0 or T5.1.1).
    family_target: our target, a directory under `models_dir`.
    family_drafts: our drafts (directories under `models_dir`) priced for it.
    loop_reference: the family draft whose pair's loop work (per step, iteration and
      proposal) prices the shapes' pairs too (`regime_predictions.loop_costs`): an
      independent T5 draft, as the shapes are.
    models_dir: where our family is.
    checkpoints_dir: where the shapes' float16 checkpoints are written, once ("":
      `<data_dir>/regime_map_models`).
    temperatures: sampling temperatures the pairs are timed at (0 = greedy).
    prompt_len: tokens of the prompt every model encodes (EOS included).
    max_decode_len: tokens the loops decode at most; with `max_gamma`, the cache the step
      timings score into (`timing.timing_geometry`, as `experiments.run` times them).
    max_gamma: gamma = 1..max_gamma are priced, so T_verify(k) is timed for k = 1..max_gamma + 1.
    draft_gamma: the gamma the draft and the loops are timed at.
    loop_batches: prompts (batch 1) our family's loops are timed on (`prompt_batches`); the
      step costs and encoders are timed on the first.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).
    timing_rounds: rounds over every k of T_verify(k).
    dtype: compute dtype the checkpoints load in.
    param_dtype: dtype the parameters are held in (float32 on a CPU: float16 holds them
      exactly, so the decoder packs float16 panels).
    seed: seed of the first shape's weights (the others count up) and of the samples.
  """

  shapes: tuple[str, ...] = ("t5-small", "t5-base", "t5-large", "t5-v1_1-small",
                             "t5-v1_1-base", "t5-v1_1-large")
  family_target: str = "target"
  family_drafts: tuple[str, ...] = ("draft_shared_enc_d192", "draft_small_kd",
                                    "draft_shared_enc_signals", "draft_small")
  loop_reference: str = "draft_small"
  models_dir: str = os.path.join("assets", "models")
  checkpoints_dir: str = ""
  temperatures: tuple[float, ...] = (0.0, 1.0)
  prompt_len: int = 32
  max_decode_len: int = 64
  max_gamma: int = 7
  draft_gamma: int = 3
  loop_batches: int = 4
  timing_calls: int = 4
  timing_repeats: int = 5
  timing_rounds: int = 5
  dtype: str = "float32"
  param_dtype: str = "float32"
  seed: int = 0

  def __post_init__(self):
    for name in ("shapes", "family_drafts", "temperatures"):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    unknown = sorted(set(self.shapes) - set(SHAPES))
    if unknown:
      raise ValueError(f"shapes has {unknown}; use any of {sorted(SHAPES)}.")
    if not self.shapes and not self.family_drafts:
      raise ValueError("shapes and family_drafts are both empty: there is nothing to pair.")
    if self.shapes and self.loop_reference not in self.family_drafts:
      raise ValueError(f"loop_reference={self.loop_reference!r} must be one of family_drafts "
                       f"{list(self.family_drafts)}: the shapes' pairs are priced with its "
                       "loop work.")
    for name in ("prompt_len", "max_decode_len", "max_gamma", "draft_gamma", "loop_batches",
                 "timing_calls", "timing_repeats", "timing_rounds"):
      validation.as_int(name, getattr(self, name), minimum=2 if name == "prompt_len" else 1)
    if self.draft_gamma > self.max_gamma:
      raise ValueError(f"draft_gamma={self.draft_gamma} must lie in 1..max_gamma="
                       f"{self.max_gamma}.")
    for i, t in enumerate(self.temperatures):
      validation.as_real(f"temperatures[{i}]", t, minimum=0.0, what="0 = greedy")

  def checkpoint_dir(self, name: str) -> str:
    """Where model `name` is read from: a shape's built checkpoint, or our family's."""
    if name in SHAPES:
      root = self.checkpoints_dir or os.path.join(layout.default_data_dir(), "regime_map_models")
      return os.path.join(root, name)
    return os.path.join(self.models_dir, name)


@dataclasses.dataclass(frozen=True)
class Job:
  """One row to measure: a model (`draft` None) or a draft for it at a temperature."""

  target: str
  draft: str | None = None
  temperature: float | None = None

  @property
  def key(self) -> tuple:
    if self.draft is None:
      return ("model", self.target)
    return ("pair", self.draft, self.target, float(self.temperature))


def architecture(name: str) -> str:
  """A shape's architecture: "relu" (T5 v1.0) or "gated-gelu" (T5.1.1)."""
  return get_config(name).feed_forward_proj


def pairs(settings: MapSettings) -> list[tuple[str, str]]:
  """(draft, target): each family draft for the family target, then each shape for every
  larger shape (by parameters) of its architecture."""
  by_size = sorted(settings.shapes, key=SHAPES.__getitem__)
  shape_pairs = [(d, t) for i, t in enumerate(by_size) for d in by_size[:i]
                 if architecture(d) == architecture(t)]
  return [(d, settings.family_target) for d in settings.family_drafts] + shape_pairs


def plan(settings: MapSettings) -> list[Job]:
  """Every row of the run in measurement order: per target (our family's first, then the
  shapes by size), its model row, then its drafts' rows, temperature by temperature."""
  targets = [settings.family_target] * bool(settings.family_drafts)
  targets += sorted(settings.shapes, key=SHAPES.__getitem__)
  all_pairs = pairs(settings)
  return [job for target in targets for job in [Job(target)] + [
      Job(target, d, float(t)) for d, tt in all_pairs if tt == target
      for t in settings.temperatures]]


def pending(settings: MapSettings, rows: Iterable[regime_rows.Row]) -> list[Job]:
  """The jobs of `plan` whose row is not among `rows` (what a resumed run measures)."""
  done = {r.key for r in rows}
  return [job for job in plan(settings) if job.key not in done]


def prompt_batches(prompt_len: int, count: int) -> list[np.ndarray]:
  """`count` int32 `[1, prompt_len]` prompts: the committed En-De test inputs joined and cut
  into consecutive pieces of `prompt_len - 1` tokens, each ended by EOS, so that every
  position holds a real token and every prompt has the same shape (one compiled program).

  Raises:
    ValueError: the committed inputs hold fewer tokens than that.
  """
  examples, source = prompts.load_examples(TASK, prompts.PROMPTS_SPLIT, None)
  processor = spm.SentencePieceProcessor(model_file=prompts.VOCAB_PATH)
  ids = processor.encode(" ".join(x for x, _ in examples))
  piece = prompt_len - 1
  if len(ids) < count * piece:
    raise ValueError(f"{source} holds {len(ids)} tokens, fewer than {count} prompts of "
                     f"prompt_len={prompt_len}; lower prompt_len or loop_batches.")
  return [np.array([ids[i * piece:(i + 1) * piece] + [prompts.EOS_ID]], np.int32)
          for i in range(count)]


def last_level_cache() -> dict[str, Any] | None:
  """This CPU's largest cache as the kernel reports it (`/sys/devices/system/cpu/cpu0/cache`):
  {"level", "bytes", "shared_cpu_list"}, or None where it reports none."""
  caches = []
  for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
    try:
      fields = {name: _read_text(os.path.join(index, name))
                for name in ("level", "type", "size", "shared_cpu_list")}
    except OSError:
      continue
    if fields["type"] in ("Unified", "Data"):
      caches.append({"level": int(fields["level"]), "bytes": parse_size(fields["size"]),
                     "shared_cpu_list": fields["shared_cpu_list"]})
  return max(caches, key=lambda c: (c["level"], c["bytes"]), default=None)


def _read_text(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read().strip()


def parse_size(text: str) -> int:
  """Bytes of a sysfs cache size such as "32768K", "1M" or "512"."""
  units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
  text = text.strip().upper()
  if text and text[-1] in units:
    return int(text[:-1]) * units[text[-1]]
  return int(text)


def random_params(cfg: T5Config, seed: int) -> dict:
  """Random weights of `cfg`'s parameter tree (`T5Model.param_info`), float32 numpy.

  Matrices and tables are normal with standard deviation 1 / sqrt(their first dimension),
  layer-norm scales are 1: finite in float16, and nothing here depends on their values (the
  map times model calls; alpha comes from elsewhere). NumPy draws them several times faster
  than `T5Model.init_params`, which also compiles a forward pass.
  """
  rng = np.random.default_rng(seed)

  def draw(path: tuple, info: Any) -> np.ndarray:
    if path[-1].key == "scale":
      return np.ones(info.shape, np.float32)
    return rng.standard_normal(info.shape, dtype=np.float32) / np.float32(np.sqrt(info.shape[0]))

  return jax.tree_util.tree_map_with_path(draw, T5Model(cfg).param_info(),
                                          is_leaf=lambda x: isinstance(x, ParamInfo))


def write_shape(name: str, path: str, seed: int) -> None:
  """Writes a random-weight model of shape `name` to `path` in float16 (`random_params`,
  `save_hf_checkpoint`), unless one is there (the same seed gives the same weights).

  Raises:
    ValueError: `name` is not one of `SHAPES`.
  """
  if name not in SHAPES:
    raise ValueError(f"name={name!r} is not a shape; use any of {sorted(SHAPES)}.")
  if os.path.isfile(os.path.join(path, "config.json")):
    return
  cfg = get_config(name, dropout_rate=0.0)
  save_hf_checkpoint(path, cfg, random_params(cfg, seed), dtype="float16")


def streamed_bytes(decoder: DecodeWeights) -> int:
  """Bytes of weights one decoder call reads: every prepared weight (float16 panels where
  float16 holds them exactly) but the embedding table, of which it reads one row per token."""
  return int(sum(x.size * x.dtype.itemsize
                 for x in jax.tree.leaves(decoder.replace(embedding=None))))


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A model read from its checkpoint directory, its weights prepared on the device.

  Attributes:
    model: a `T5Model`, or a `SharedEncoderModel` (a draft reading the target's encoder).
    params: `model.prepare`'s weights.
    info: what the rows record of it: directory, parameters, bytes on disk and per
      decoder call (`streamed_bytes`), seconds to write and to load it.
  """

  model: T5Model | SharedEncoderModel
  params: PreparedParams
  info: dict[str, Any]


def load(settings: MapSettings, name: str) -> Loaded:
  """Model `name` loaded as a user's checkpoint is (`load_hf_checkpoint` for a T5,
  `load_model` for one of our shared-encoder drafts), a shape written first if missing."""
  path = settings.checkpoint_dir(name)
  began = time.perf_counter()
  if name in SHAPES:
    write_shape(name, path, settings.seed + list(SHAPES).index(name))
  built_s = time.perf_counter() - began
  overrides = dict(dtype=settings.dtype, param_dtype=settings.param_dtype, dropout_rate=0.0)
  if name in SHAPES:
    cfg, params = load_hf_checkpoint(path, **overrides)
    model = T5Model(cfg)
  else:
    model, params = load_model(path, **overrides)
  prepared = model.prepare(jax.device_put(params))
  info = {"checkpoint_dir": path, "params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
          "checkpoint_bytes": sum(os.path.getsize(f) for f in glob.glob(
              os.path.join(path, "*.safetensors"))),
          "decoder_bytes": streamed_bytes(prepared.decoder),
          "write_s": built_s, "load_s": time.perf_counter() - began - built_s}
  return Loaded(model, prepared, info)


def config_fields(model: T5Model | SharedEncoderModel) -> dict[str, Any]:
  """The architecture a row records."""
  cfg = model.config
  return {"d_model": cfg.d_model, "d_ff": cfg.d_ff, "num_layers": cfg.num_layers,
          "num_decoder_layers": cfg.num_decoder_layers, "num_heads": cfg.num_heads,
          "d_kv": cfg.d_kv, "vocab_size": cfg.vocab_size,
          "feed_forward_proj": cfg.feed_forward_proj,
          "tie_word_embeddings": cfg.tie_word_embeddings}


def encoder_time(scorer: T5Scorer, inputs: Array, cache_len: int, repeats: int
                 ) -> tuple[float, float]:
  """(median seconds, compile seconds) of the target's work once per sequence: its encoder
  (`encode`) and its empty cache (`init_state`), as `timing.measure_loop_costs` times it.

  Args:
    scorer: the target's scorer.
    inputs: int32 `[batch, prompt_len]`.
    cache_len: the cache's positions.
    repeats: timed calls of each (the median is used).
  """
  context = scorer.encode(inputs)
  timings = [timing.time_calls(lambda: scorer.encode(inputs), repeats),
             timing.time_calls(lambda: timing.state_arrays(
                 scorer, context, cache_len=cache_len), repeats)]
  return sum(t.median_s for t in timings), sum(t.compile_s for t in timings)


def _stamp() -> dict[str, Any]:
  """Where and when a row was measured."""
  return {"environment": {**timing.environment(), "last_level_cache": last_level_cache()},
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def measure_model(settings: MapSettings, name: str, loaded: Loaded, inputs: Array) -> ModelRow:
  """The model row of `name` (a target): its step costs and its encoder.

  Args:
    settings: the run's settings.
    name: the model's name.
    loaded: the model (a `T5Model`).
    inputs: int32 `[1, prompt_len]`, cut to its length bucket.
  """
  scorer = T5Scorer(loaded.model, loaded.params)
  with contention.quiet(f"{name}: target step times") as verify_guard:
    verify = timing.verify_times(
        scorer, inputs, max_gamma=settings.max_gamma, max_decode_len=settings.max_decode_len,
        calls=settings.timing_calls, repeats=settings.timing_repeats,
        rounds=settings.timing_rounds)
  cache_len, _ = timing.timing_geometry(settings.max_decode_len, settings.max_gamma)
  with contention.quiet(f"{name}: encoder") as guard:
    encoder_s, encoder_compile_s = encoder_time(scorer, inputs, cache_len,
                                                settings.timing_repeats)
  t_chunk = verify.t_chunk
  return ModelRow(
      model=name, family="t5 public" if name in SHAPES else "ours",
      public_params=SHAPES.get(name), **config_fields(loaded.model), **loaded.info,
      t_step_s=verify.t_step, t_verify_s=dict(t_chunk),
      verify_ratio={k: t / verify.t_step for k, t in t_chunk.items()},
      verify_spread=dict(verify.spread), verify_compile_s=verify.compile_s,
      encoder_s=encoder_s, encoder_compile_s=encoder_compile_s,
      prompt_len=int(inputs.shape[1]), idle_check_verify=verify_guard.record(),
      idle_check=guard.record(), settings=settings_record(settings), **_stamp())


def measure_pair(settings: MapSettings, job: Job, target: Loaded, draft: Loaded,
                 target_row: ModelRow, batches: list[Array]) -> PairRow:
  """The pair row of `job`: the draft's seconds per proposed token and, for our family's
  pairs, both loops' own work and both encoders (`measure_loops`).

  A shape's pair times its draft alone: its loops would run 10-90 ms per iteration, whose
  timing noise exceeds the loop's own work (about a millisecond on a CPU, the loop's ops,
  whatever the models), and compiling them costs about a minute per pair. Its predictions
  take the loop work of `settings.loop_reference`'s pair and the encoders of both models'
  rows (`regime_predictions.loop_costs`).

  Args:
    settings: the run's settings.
    job: the pair (draft, target, temperature).
    target: the target (a `T5Model`).
    draft: the draft.
    target_row: the target's model row (its T_verify(k)).
    batches: int32 `[1, prompt_len]` prompts (`prompt_batches`); the draft is timed on the
      first, the loops on all.
  """
  scorer = T5Scorer(target.model, target.params)
  spec = make_draft(draft.model, draft.params)
  warp = Warp(job.temperature)
  began = time.perf_counter()
  with contention.quiet(f"{job.draft} for {job.target} at T={job.temperature:g}") as guard:
    cost = timing.draft_time(
        spec, batches[0], gamma=settings.draft_gamma, warp=warp,
        max_decode_len=settings.max_decode_len, max_gamma=settings.max_gamma,
        calls=settings.timing_calls, repeats=settings.timing_repeats, seed=settings.seed,
        target=scorer)
    loops = (None if job.draft in SHAPES else
             measure_loops(settings, scorer, spec, warp, target_row, cost.seconds, batches))
  return PairRow(
      draft=job.draft, target=job.target, temperature=float(job.temperature),
      draft_gamma=settings.draft_gamma, draft_params=draft.info["params"],
      draft_decoder_bytes=draft.info["decoder_bytes"],
      draft_reads_target_encoder=spec.reads_target_encoder, t_draft_s=cost.seconds,
      c=cost.seconds / target_row.t_step_s, draft_compile_s=cost.compile_s,
      loop_costs=None if loops is None else loops[0],
      alpha_of_these_weights=None if loops is None else loops[1].beta,
      measure_s=time.perf_counter() - began, idle_check=guard.record(),
      settings=settings_record(settings), **_stamp())


def measure_loops(settings: MapSettings, scorer: T5Scorer, draft: Draft, warp: Warp,
                  target_row: ModelRow, t_draft: float, batches: list[Array]
                  ) -> tuple[LoopCosts, gamma_choice.AlphaEstimate]:
  """Both loops' own work and both encoders on `batches` (`timing.measure_loop_costs`,
  the speculative loop at `draft_gamma` and at `timing.second_gamma`'s), with the
  target's T_verify(k) fitted non-decreasing as `timing.calibrate` passes them."""
  t_chunk = target_row.t_verify_s
  fitted = {k: t_chunk[1] * r for k, r in gamma_choice.fitted_ratios(
      {k: t / t_chunk[1] for k, t in t_chunk.items()}).items()}
  return timing.measure_loop_costs(
      scorer, draft, batches, gamma=settings.draft_gamma, warp=warp,
      max_decode_len=settings.max_decode_len, eos_id=scorer.model.config.eos_token_id,
      t_chunk=fitted, t_draft=t_draft, rng=jax.random.PRNGKey(settings.seed),
      repeats=settings.timing_repeats, held_out=False,
      slope_gamma=timing.second_gamma(settings.draft_gamma, settings.max_gamma))


def settings_record(settings: MapSettings) -> dict[str, Any]:
  """The settings as JSON (tuples as lists)."""
  return {k: list(v) if isinstance(v, tuple) else v
          for k, v in dataclasses.asdict(settings).items()}


class _Models:
  """The loaded models, each loaded on first use; `keep` drops the others."""

  def __init__(self, settings: MapSettings, say: Callable[[str], Any]):
    self.settings, self.say, self.loaded = settings, say, {}

  def get(self, name: str) -> Loaded:
    if name not in self.loaded:
      self.loaded[name] = load(self.settings, name)
      info = self.loaded[name].info
      self.say(f"{name}: {info['params'] / 1e6:.1f}M parameters, decoder "
               f"{info['decoder_bytes'] / 2**20:.1f} MiB per call (written in "
               f"{info['write_s']:.0f} s, loaded in {info['load_s']:.0f} s)")
    return self.loaded[name]

  def keep(self, names: set[str]) -> None:
    self.loaded = {n: m for n, m in self.loaded.items() if n in names}


def _say(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def run(settings: MapSettings, output_dir: str, say: Callable[[str], Any] = _say
        ) -> list[dict[str, Any]]:
  """Measures every row of `plan(settings)` missing from `<output_dir>/rows.jsonl`.

  Returns:
    All rows of the file, those measured before included, as the file holds them
    (`regime_predictions.write_report` reads them).
  """
  path = os.path.join(output_dir, ROWS_FILE)
  rows = {r.key: r for r in map(regime_rows.read_row, results_io.read_rows(path))}
  jobs = pending(settings, rows.values())
  say(f"regime map: {len(jobs)} of {len(plan(settings))} rows to measure into {path}.")
  batches = [jnp.asarray(buckets.to_bucket(x))
             for x in prompt_batches(settings.prompt_len, settings.loop_batches)]
  models = _Models(settings, say)
  for i, job in enumerate(jobs, 1):
    models.keep({job.target, job.draft})
    began = time.perf_counter()
    for attempt in contention.attempts(say):
      with attempt:
        if job.draft is None:
          row = measure_model(settings, job.target, models.get(job.target), batches[0])
        else:
          row = measure_pair(settings, job, models.get(job.target), models.get(job.draft),
                             rows[("model", job.target)], batches)
    row = dataclasses.replace(row, wall_s=time.perf_counter() - began)
    results_io.append_row(path, row.to_json())
    rows[job.key] = row
    say(f"[{i}/{len(jobs)}] {describe(row)} ({row.wall_s:.0f} s)")
    programs.drop_when_crowded()  # Each row compiles its own programs.
  return [row.to_json() for row in rows.values()]


def describe(row: regime_rows.Row) -> str:
  """One line of a row's main numbers."""
  if isinstance(row, ModelRow):
    ratios = " ".join(f"{row.verify_ratio[k]:.2f}" for k in range(2, len(row.verify_ratio) + 1))
    return (f"{row.model}: T_step {1e3 * row.t_step_s:.2f} ms, T_verify(k)/T_step "
            f"k=2.. {ratios}, encoder {1e3 * row.encoder_s:.1f} ms")
  line = f"{row.draft} for {row.target} T={row.temperature:g}: c {row.c:.3f}"
  loops = row.loop_costs
  if loops is None:
    return line
  return (f"{line}, loop work {1e3 * loops.iteration_overhead_s:.2f} ms per iteration + "
          f"{1e3 * loops.proposal_overhead_s:.2f} per proposal, "
          f"{1e3 * loops.step_overhead_s:.2f} per baseline step")
