"""Timing: decoders and their parts, on any scorer and draft, and the costs they add up to.

Every timing in the project goes through here, in three layers:

- the clock: `time_calls` (one function, its first call apart as compilation),
  `time_rotated` (programs called in turn), `time_interleaved` (compared decoders
  rotated per batch and pass, so background load hits all alike; medians over passes)
  and `time_decoders` (the baseline against a speculative decoder, every call with a key
  of its own, `Draws`, per generated token, `decoder_times`; greedy tokens checked);
- the parts the loops call, each the per-call time of a jitted `lax.fori_loop` (Python
  dispatch and host round-trips excluded, as inside the decoders' while loops):
  `target_step_times` (`Scorer.score` of k tokens: T_step, T_verify(k)),
  `draft_token_time` (`Draft.propose`: T_draft), `propose_verify_time` (the pair);
- the costs `theory.CostModel` and gamma = 'auto' are made of: `verify_times`
  (T_verify(k) in rounds), `draft_time`, `time_sequence_work` (the encoders),
  `measure_loop_costs` (each loop's own work: `theory.LoopCosts`), `calibrate` (the
  choice, `gamma_choice.make_choice`), and `time_point`, one measured point's whole
  timing record (where it ran included, `environment`). `choose_gamma` is the checked
  entry point for gamma = 'auto' over any scorer and draft.

Nothing here checks that the machine is quiet: whoever times applies the guard
(`contention.quiet`) around these calls and records its check beside the numbers
(`time_point` takes the guard as an argument). `environment` says where a measurement
ran. No TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import os
import platform
import statistics
import subprocess
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from specdec_jax import distributed, validation
from specdec_jax.costs.gamma_choice import (
  DEFAULT_MAX_GAMMA,
  AlphaEstimate,
  GammaChoice,
  check_alpha,
  fitted_ratios,
  make_choice,
  pooled_alpha,
)
from specdec_jax.costs.loop_work import fit_loop_work
from specdec_jax.decoding import baseline, buckets, programs, speculative
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Context, EncoderOutputs, Scorer
from specdec_jax.theory import LoopCosts

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Timing:
  """Wall-clock times of repeated calls of one function.

  Attributes:
    first_s: the first call (includes compilation for a fresh jitted program).
    times_s: the later calls, in order.
  """

  first_s: float
  times_s: tuple[float, ...]

  @property
  def median_s(self) -> float:
    return statistics.median(self.times_s)

  @property
  def compile_s(self) -> float:
    """First call minus a steady call: the compilation (and first-run) overhead."""
    return max(self.first_s - self.median_s, 0.0)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
  """Calls `fn()`, blocks until its outputs are ready; returns (seconds, outputs)."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


# JAX's own clocks of a program's compilation: tracing, lowering, XLA's compile.
COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration",
                            "/jax/core/compile/backend_compile_duration"})


@contextlib.contextmanager
def compiling() -> Iterator[list[float]]:
  """Collects the seconds JAX reports compiling (`COMPILE_EVENTS`) while the block runs:
  `with compiling() as seconds: ...; sum(seconds)`. A program the persistent cache
  holds reports its tracing and lowering, not XLA's compile."""
  seconds: list[float] = []

  def listen(event: str, duration: float, **_: Any) -> None:
    if event in COMPILE_EVENTS:
      seconds.append(duration)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield seconds
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


@dataclasses.dataclass(frozen=True)
class Span:
  """Wall-clock seconds spent in a named span, and the part of them JAX spent compiling.

  Attributes:
    seconds: the wall-clock seconds.
    compile_s: of them, JAX's compilation (`compiling`).
  """

  seconds: float = 0.0
  compile_s: float = 0.0

  def __add__(self, other: Span) -> Span:
    return Span(self.seconds + other.seconds, self.compile_s + other.compile_s)

  @property
  def rest_s(self) -> float:
    """The seconds that were not compilation."""
    return max(self.seconds - self.compile_s, 0.0)


class Stopwatch:
  """Seconds spent inside named spans, summed per name (`with watch("load"):`), with
  the compilation inside them apart (`Span`)."""

  def __init__(self) -> None:
    self.spans: dict[str, Span] = {}

  @contextlib.contextmanager
  def __call__(self, name: str) -> Iterator[None]:
    start = time.perf_counter()
    with compiling() as compiled:
      try:
        yield
      finally:
        self.spans[name] = self.spans.get(name, Span()) + Span(
            time.perf_counter() - start, sum(compiled))

  def pop(self, name: str) -> Span:
    """The span `name` so far (empty if none), forgotten."""
    return self.spans.pop(name, Span())


def time_calls(fn: Callable[[], Any], repeats: int) -> Timing:
  """Times one first call and then `repeats` further calls of `fn()`.

  Args:
    fn: a function of no arguments returning JAX arrays (or pytrees of them).
    repeats: number of timed calls after the first, >= 1.

  Returns:
    A `Timing`.
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1 (timed calls after the first), got {repeats}.")
  first_s, _ = timed(fn)
  return Timing(first_s, tuple(timed(fn)[0] for _ in range(repeats)))


@dataclasses.dataclass(frozen=True)
class DecoderTiming:
  """Wall-clock times of one decoder in `time_interleaved`.

  Attributes:
    first_s: its warm-up calls, one per warm-up batch: a decoding loop's compilation
      (`programs.compile_only`), another decoder's (a peer's) whole first call.
    calls_s: `[pass][batch]` seconds of every later call.
    warmup: the warm-up batches, one per compiled program (`first_of_each_shape`).
  """

  first_s: tuple[float, ...]
  calls_s: tuple[tuple[float, ...], ...]
  warmup: tuple[int, ...] = (0,)

  @property
  def totals_s(self) -> tuple[float, ...]:
    """Per pass, the seconds of all its batches."""
    return tuple(sum(calls) for calls in self.calls_s)

  @property
  def median_s(self) -> float:
    """The median over passes of the total over all batches."""
    return statistics.median(self.totals_s)

  @property
  def compile_s(self) -> float:
    """The warm-up calls' seconds: the decoder's compilation."""
    return sum(self.first_s)


def first_of_each_shape(batches: Sequence[Any]) -> tuple[int, ...]:
  """The index of the first batch of each distinct shape (each compiles its own program)."""
  seen: dict[tuple, int] = {}
  for i, batch in enumerate(batches):
    shape = tuple(getattr(x, "shape", ()) for x in jax.tree.leaves(batch))
    seen.setdefault(shape, i)
  return tuple(seen.values())


def rotated(names: Sequence[str], shift: int) -> list[str]:
  """`names` rotated left by `shift` (two names: reversed every other shift)."""
  shift %= len(names)
  return list(names[shift:]) + list(names[:shift])


def time_rotated(programs: dict[Any, Callable[[], Any]], repetitions: int
                 ) -> dict[Any, list[float]]:
  """Seconds of every call of each program, the programs called in turn.

  Each program is called once first (its compilation), untimed. Then, in each
  of `repetitions` repetitions, every program is called once, in the order of
  `programs` rotated by the repetition, so all of them see the same machine.

  Args:
    programs: key -> function of no arguments returning JAX arrays.
    repetitions: timed calls of each program, >= 1.

  Returns:
    key -> `repetitions` seconds, in call order.
  """
  for fn in programs.values():
    jax.block_until_ready(fn())
  seconds: dict[Any, list[float]] = {key: [] for key in programs}
  for rep in range(repetitions):
    for key in rotated(list(programs), rep):
      seconds[key].append(timed(programs[key])[0])
  return seconds


def time_interleaved(decoders: dict[str, Callable[[int], Any]], num_batches: int,
                     passes: int, *, fetch: Callable[[Any], Any] = jax.device_get,
                     check: Callable[[int, dict[str, Any]], None] | None = None,
                     warmup: Sequence[int] = (0,), min_s: float = 0.0, max_passes: int = 1
                     ) -> tuple[dict[str, DecoderTiming], dict[str, list]]:
  """Times decoders against each other over the same batches.

  Each decoder is first warmed up on the `warmup` batches (one per compiled
  program: batches of another shape compile their own) under
  `programs.compile_only`, so a decoding loop compiles there without decoding;
  those calls are timed apart. Then,
  in each of `passes` passes, every batch is decoded by every decoder, in the
  order of `decoders` rotated by pass + batch (so each decoder goes first
  equally often on every batch over passes). Outputs are fetched after their
  call's timing.

  Args:
    decoders: name -> function of a batch index returning the decoder's output
      (any pytree; timed until ready).
    num_batches: batches per pass.
    passes: timed passes, >= 1.
    fetch: brings one output to the host (default `jax.device_get`).
    check: called after each batch of each pass with the batch index and
      {name: fetched output}; raise in it to stop (e.g. greedy outputs that differ).
    warmup: the batches called once before the passes (`first_of_each_shape`
      of the batches; default batch 0, for batches of one shape).
    min_s: after `passes`, further passes run, up to `max_passes` in all, until
      every decoder's timed calls add up to at least this many seconds: a
      median over passes of decodings that take milliseconds (0: `passes`).
    max_passes: the most passes `min_s` may run.

  Returns:
    {name: DecoderTiming}, and the first pass's fetched outputs per decoder (a
    list over batches).
  """
  if passes < 1:
    raise ValueError(f"passes must be >= 1, got {passes}.")
  if not warmup or not all(0 <= i < num_batches for i in warmup):
    raise ValueError(f"warmup must list batch indices in [0, {num_batches}), got {warmup}.")
  names = list(decoders)
  with programs.compile_only():
    first = {name: tuple(timed(lambda fn=fn, i=i: fn(i))[0] for i in warmup)
             for name, fn in decoders.items()}
  calls_s: dict[str, list[list[float]]] = {name: [] for name in names}
  outputs: dict[str, list] = {name: [] for name in names}

  def more(rep: int) -> bool:
    return rep < passes or (rep < max_passes and min(
        sum(map(sum, calls_s[name])) for name in names) < min_s)

  rep = 0
  while more(rep):
    for name in names:
      calls_s[name].append([0.0] * num_batches)
    for i in range(num_batches):
      batch_out = {}
      for name in rotated(names, rep + i):
        seconds, out = timed(lambda fn=decoders[name], i=i: fn(i))
        calls_s[name][rep][i] = seconds
        batch_out[name] = fetch(out)
      if rep == 0:
        for name in names:
          outputs[name].append(batch_out[name])
      if check is not None:
        check(i, batch_out)
    rep += 1
  timings = {name: DecoderTiming(first[name], tuple(tuple(c) for c in calls_s[name]),
                                 tuple(warmup))
             for name in names}
  return timings, outputs


def _first_difference(base: Any, spec: Any) -> str:
  a, b = np.asarray(base.sequences), np.asarray(spec.sequences)
  if np.array_equal(a, b):
    return (f"lengths: baseline {np.asarray(base.lengths).tolist()}, speculative "
            f"{np.asarray(spec.lengths).tolist()}")
  row, col = np.argwhere(a != b)[0]
  return (f"row {row}, token {col}: baseline {a[row, col:col + 5].tolist()}, speculative "
          f"{b[row, col:col + 5].tolist()}")


def _same_greedy(what: str, i: int, outputs: dict[str, Any], enforce: bool) -> bool:
  """At temperature 0: whether the speculative tokens of batch i equal the baseline's.

  Raises:
    RuntimeError: they differ and `enforce`.
  """
  base, spec = outputs["baseline"], outputs["speculative"]
  if (np.array_equal(base.sequences, spec.sequences)
      and np.array_equal(base.lengths, spec.lengths)):
    return True
  message = (f"Greedy speculative output differs from the baseline ({what}, batch {i}, "
             f"{_first_difference(base, spec)})")
  if enforce:
    raise RuntimeError(f"{message}; speculative sampling at temperature 0 must reproduce the "
                       "target's greedy tokens.")
  logging.warning("%s; recorded (GreedyCheck.enforce = False).", message)
  return False


class Draws:
  """The PRNG key of every decoder call, and the tokens each call generated.

  Each call of a decoder on a batch samples with a key of its own (the seed, the
  batch, the call's number), so at T > 0 every pass draws new texts for both
  decoders: with one fixed draw per example, every pass would compare the same
  two samples of different lengths, and a per-token speedup would carry their
  difference (a sequence's fixed costs spread over more or fewer tokens).
  Decoders' j-th calls on a batch share a key.

  Attributes:
    tokens: decoder name -> `[pass][batch]` generated tokens (`record`).
    greedy_identical: at temperature 0, whether every greedy output equaled the baseline's
      (`enforce_greedy` False: recorded, not refused); None at T > 0.
  """

  def __init__(self, seed: int, names: Sequence[str], num_batches: int, temperature: float,
               enforce_greedy: bool = True, what: str = "") -> None:
    """`what` names the timing in a refusal (the point)."""
    self._base = jax.random.PRNGKey(seed)
    self._calls = {name: [0] * num_batches for name in names}
    self._num_batches = num_batches
    self._greedy = temperature == 0
    self._enforce_greedy = enforce_greedy
    self._what = what
    self.tokens: dict[str, list[list[int]]] = {name: [] for name in names}
    self.greedy_identical: bool | None = True if self._greedy else None

  def key(self, name: str, i: int) -> Array:
    """The key of decoder `name`'s next call on batch `i`."""
    n = self._calls[name][i]
    self._calls[name][i] += 1
    return jax.random.fold_in(jax.random.fold_in(self._base, i), n)

  def record(self, i: int, outputs: dict[str, Any]) -> None:
    """`time_interleaved`'s check: keeps each output's token count (called pass by pass,
    batch by batch) and, at temperature 0, checks greedy equality."""
    if self._greedy and not _same_greedy(self._what, i, outputs, self._enforce_greedy):
      self.greedy_identical = False
    for name, out in outputs.items():
      if i == 0:
        self.tokens[name].append([0] * self._num_batches)
      self.tokens[name][-1][i] = int(np.sum(out.lengths))


def decoder_times(timings: dict[str, DecoderTiming],
                  tokens: dict[str, list[list[int]]]) -> dict[str, Any]:
  """The decoders' times, tokens and the measured speedup, per generated token (at T > 0
  the decoders sample texts of different lengths; each pass draws anew, `Draws`), as a
  results row holds them (`record.PointRow`)."""
  fields: dict[str, Any] = {}
  per_batch = {}
  for name, decoder in timings.items():
    per_pass = [1e3 * seconds / max(sum(n), 1)
                for seconds, n in zip(decoder.totals_s, tokens[name], strict=True)]
    fields.update({f"{name}_s": list(decoder.totals_s), f"{name}_median_s": decoder.median_s,
                   f"{name}_compile_s": decoder.compile_s,
                   f"{name}_tokens": sum(tokens[name][0]),
                   f"{name}_ms_per_token": statistics.median(per_pass)})
    passes = list(zip(decoder.calls_s, tokens[name], strict=True))
    per_batch[name] = [statistics.median(calls[i] / max(n[i], 1) for calls, n in passes)
                       for i in range(len(tokens[name][0]))]
  speedups = np.divide(per_batch["baseline"], per_batch["speculative"])
  return fields | dict(
      speedup_measured=fields["baseline_ms_per_token"] / fields["speculative_ms_per_token"],
      speedup_walltime_ratio=fields["baseline_median_s"] / fields["speculative_median_s"],
      speedup_spread=[float(q) for q in np.percentile(speedups, [10, 50, 90])])


@dataclasses.dataclass(frozen=True)
class DecodersTiming:
  """The baseline and a speculative decoder timed against each other (`time_decoders`).

  Attributes:
    timings: {"baseline", "speculative"}: each decoder's `DecoderTiming`.
    outputs: each decoder's first-pass outputs, fetched, one per batch.
    per_token: `decoder_times`: seconds, tokens and milliseconds per generated token of
      each, and the measured speedup.
    greedy_identical: at temperature 0, whether every speculative output equaled the
      baseline's; None at T > 0.
  """

  timings: dict[str, DecoderTiming]
  outputs: dict[str, list]
  per_token: dict[str, Any]
  greedy_identical: bool | None


def time_decoders(decoders: Mapping[str, Callable[[Array, Array], Any]],
                  batches: Sequence[Array], *, passes: int, seed: int, temperature: float,
                  enforce_greedy: bool, what: str) -> DecodersTiming:
  """Times "baseline" against "speculative" over `batches`, per generated token.

  The decoders are interleaved (`time_interleaved`: one warm-up call per batch shape,
  outputs fetched with `distributed.fetch`); every call samples with a key of its own
  (`Draws`) and, at temperature 0, the speculative tokens are checked equal to the
  baseline's. No guard here: the caller's (`contention.quiet`) wraps the call.

  Args:
    decoders: {"baseline", "speculative"}: (batch, PRNG key) -> the decoder's output.
    batches: int32 `[batch, input_len]` checked batches, cut to their length bucket.
    passes: timed passes over the batches.
    seed: the seed of the calls' keys.
    temperature: the sampling temperature (0: greedy, checked).
    enforce_greedy: raise when greedy tokens differ (else recorded).
    what: the timing's name in a refusal (the point).

  Raises:
    RuntimeError: at temperature 0 the tokens differ and `enforce_greedy`.
  """
  draws = Draws(seed, list(decoders), len(batches), temperature, enforce_greedy, what)
  calls = {name: lambda i, name=name, decoder=decoder: decoder(batches[i], draws.key(name, i))
           for name, decoder in decoders.items()}
  timings, outputs = time_interleaved(calls, len(batches), passes, fetch=distributed.fetch,
                                      check=draws.record, warmup=first_of_each_shape(batches))
  return DecodersTiming(timings, outputs, decoder_times(timings, draws.tokens),
                        draws.greedy_identical)


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Per-call seconds of one program inside a jitted loop, and its compile time."""

  seconds: float
  compile_s: float


def _per_call(loop: Callable[[], Array], calls: int, repeats: int) -> StepTimes:
  timing = time_calls(loop, repeats)
  return StepTimes(timing.median_s / calls, timing.compile_s)


def target_step_times(target: Scorer, inputs: Array, *, chunk_lengths: Sequence[int],
                      cache_len: int, position: int, calls: int, repeats: int
                      ) -> dict[int, StepTimes]:
  """Seconds per `target.score` call of k tokens, for each k in `chunk_lengths`.

  k = 1 is the baseline's step time T_step; k = gamma + 1 is the verification
  time T_verify(k) of one speculative iteration. Each call scores k tokens at
  `position` of a state of `cache_len` positions (rewound after every call), so
  every k attends over the same context. Any `Scorer`: for a `T5Scorer` a
  call is `T5Model.decode_chunk`. The work done once per sequence (`encode`,
  `init_state`: a T5's encoder, a decoder-only model's prefill) runs once,
  outside the timing.

  Args:
    target: the target's scorer.
    inputs: int32 `[batch, input_len]`, what `target.encode` takes (the batch
      size is timed).
    chunk_lengths: the k to time, each >= 1.
    cache_len: positions of the state (as in the decoders).
    position: cached length at which each chunk is scored.
    calls: `score` calls per jitted loop.
    repeats: timed loop runs (the median is used).

  Returns:
    {k: StepTimes}.
  """
  if min(chunk_lengths) < 1 or position + max(chunk_lengths) > cache_len:
    raise ValueError(f"chunk_lengths {list(chunk_lengths)} at position={position} must be >= 1 "
                     f"and fit in cache_len={cache_len}.")
  state = initial_state(target, target.encode(inputs), cache_len)
  batch = inputs.shape[0]
  start = jnp.full((batch,), position, jnp.int32)
  results = {}
  for k in chunk_lengths:
    tokens = jnp.ones((batch, k), jnp.int32)
    results[int(k)] = _per_call(
        lambda t=tokens: chunk_loop(target, state, t, start, calls=calls), calls, repeats)
  return results


@functools.partial(programs.loop_jit, static_argnames=("calls",))
def chunk_loop(target: Scorer, state: Any, tokens: Array, start: Array, *, calls: int) -> Array:
  """Runs `calls` score calls, each from `state` rewound to `start`; returns a scalar that
  depends on every call's logits."""

  def body(_, carry: tuple[Any, Array]) -> tuple[Any, Array]:
    state, acc = carry
    logits, state = target.score(target.rewind(state, start), tokens)
    return state, acc + logits[:, -1, 0].sum()

  _, acc = jax.lax.fori_loop(0, calls, body, (state, jnp.zeros((), jnp.float32)))
  return acc


@functools.partial(jax.jit, static_argnames=("cache_len",))
def state_arrays(target: Scorer, context: Context, *, cache_len: int) -> list[Array]:
  """The arrays `target.init_state(context, cache_len)` makes, without those of the context
  it carries (which a jitted call would return as copies): an empty cache, a decoder-only
  model's prefill of its prompt. With `encode`, the target's work once per sequence."""
  state = target.init_state(context, cache_len)
  given = {id(x) for x in jax.tree.leaves(context)}  # Traced alike: the same tracers.
  return [x for x in jax.tree.leaves(state) if id(x) not in given]


def initial_state(target: Scorer, context: Context, cache_len: int) -> Any:
  """`target.init_state(context, cache_len)`, compiled, holding the caller's context arrays
  (`state_arrays` for the rest)."""
  layout = {}

  def trace(t: Scorer, c: Context) -> None:
    given = {id(x): i for i, x in enumerate(jax.tree.leaves(c))}
    leaves, layout["treedef"] = jax.tree.flatten(t.init_state(c, cache_len))
    layout["sources"] = [given.get(id(x)) for x in leaves]

  jax.eval_shape(trace, target, context)  # Where each leaf comes from; nothing runs.
  made = iter(state_arrays(target, context, cache_len=cache_len))
  held = jax.tree.leaves(context)
  return jax.tree.unflatten(layout["treedef"], [next(made) if i is None else held[i]
                                                 for i in layout["sources"]])


def target_encoded_for(draft: Draft, target: Scorer, inputs: Array) -> EncoderOutputs:
  """The target's encoder outputs of `inputs` if `draft` reads them, its features of
  them if the draft reads those, else None (what `draft_token_time`'s `target_encoded`
  wants)."""
  if draft.reads_target_features:
    return target.init_state_with_features(target.encode(inputs), 1)[1]
  if not draft.reads_target_encoder:
    return None
  return target.encoder_outputs(target.encode(inputs))


def _verified_features(draft: Draft, batch: int, gamma: int) -> Array | None:
  """Zero features of a verified chunk `[batch, gamma + 1, F]` for a draft that reads
  them (its `commit` runs the chunk as in the loop), else None."""
  if not draft.reads_target_features:
    return None
  return jnp.zeros((batch, gamma + 1, draft.feature_size), jnp.float32)


def draft_token_time(draft: Draft, inputs: Array, *, gamma: int, warp: Warp, cache_len: int,
                     position: int, calls: int, repeats: int, seed: int = 0,
                     target_encoded: EncoderOutputs = None) -> StepTimes:
  """Seconds per proposed token of `draft.propose(..., gamma=gamma)`.

  This is the draft's T_draft as the speculative loop pays it (for a T5 draft:
  one catch-up chunk of 2 tokens and gamma - 1 single-token steps per call).

  Args:
    draft: any `drafts.Draft`.
    inputs: int32 `[batch, input_len]`, what `draft.init_state` takes.
    gamma: proposals per call.
    warp: the sampling settings proposals are drawn with.
    cache_len: decoder positions, as in `speculative_sample`.
    position: tokens already generated when proposing (the state is rewound to it).
    calls: `propose` calls per jitted loop.
    repeats: timed loop runs (the median is used).
    seed: PRNG seed of the proposals.
    target_encoded: the target's encoder outputs of `inputs`
      (`target_encoded_for`), for a draft that reads them
      (`draft.reads_target_encoder`).

  Returns:
    `StepTimes` with seconds per proposed token.
  """
  loop = _propose_program(draft, inputs, gamma=gamma, warp=warp, cache_len=cache_len,
                          position=position, calls=calls, seed=seed,
                          target_encoded=target_encoded)
  per_call = _per_call(loop, calls, repeats)
  return StepTimes(per_call.seconds / gamma, per_call.compile_s)


def draft_token_times_rotated(drafts: Mapping[Any, tuple[Draft, Array, EncoderOutputs]], *,
                              gamma: int, warp: Warp, cache_len: int, position: int,
                              calls: int, repetitions: int, seed: int = 0
                              ) -> dict[Any, float]:
  """`draft_token_time` of several drafts timed in turn (`time_rotated`), so that each
  repetition sees all of them on the same machine: drafts compared with each other
  by c are not told apart by the machine's drift or by their order.

  Args:
    drafts: key -> (draft, inputs, target_encoded), as `draft_token_time` takes them.
    gamma, warp, cache_len, position, calls, seed: as `draft_token_time`.
    repetitions: timed loop runs of each draft (the median is used).

  Returns:
    key -> seconds per proposed token (the median over repetitions).
  """
  programs = {key: _propose_program(draft, inputs, gamma=gamma, warp=warp, cache_len=cache_len,
                                    position=position, calls=calls, seed=seed,
                                    target_encoded=encoded)
              for key, (draft, inputs, encoded) in drafts.items()}
  seconds = time_rotated(programs, repetitions)
  return {key: statistics.median(s) / (calls * gamma) for key, s in seconds.items()}


def _propose_program(draft: Draft, inputs: Array, *, gamma: int, warp: Warp, cache_len: int,
                     position: int, calls: int, seed: int, target_encoded: EncoderOutputs
                     ) -> Callable[[], Array]:
  """`propose_loop` over `draft`'s state of `inputs` (its encoder run here, once)."""
  if position + gamma + 2 > cache_len:
    raise ValueError(f"position={position} + gamma={gamma} + 2 must fit in cache_len={cache_len}.")
  batch = inputs.shape[0]
  lengths = jnp.full((batch,), position, jnp.int32)
  tokens = jnp.ones((batch, cache_len + 1), jnp.int32)
  state = draft.init_state(inputs, cache_len, target_encoded)
  rng = jax.random.PRNGKey(seed)
  return lambda: propose_loop(draft, state, tokens, lengths, rng, gamma=gamma, warp=warp,
                              calls=calls)


@functools.partial(programs.loop_jit, static_argnames=("gamma", "warp", "calls"))
def propose_loop(draft: Draft, state: Any, tokens: Array, lengths: Array, rng: Array, *,
                  gamma: int, warp: Warp, calls: int) -> Array:
  """Runs `calls` proposals, each from the same state; returns a scalar using all of them."""

  def body(i, carry):
    state, acc = carry
    state, proposals, _ = draft.propose(state, tokens, lengths, jax.random.fold_in(rng, i),
                                        gamma=gamma, warp=warp)
    features = _verified_features(draft, tokens.shape[0], gamma)
    return draft.commit(state, lengths, tokens, features), acc + proposals.sum()

  return jax.lax.fori_loop(0, calls, body, (state, jnp.zeros((), jnp.int32)))[1]


def propose_verify_time(target: Scorer, draft: Draft, inputs: Array, *, gamma: int, warp: Warp,
                        cache_len: int, position: int, calls: int, repeats: int,
                        draft_inputs: Array | None = None, seed: int = 0) -> StepTimes:
  """Seconds per pair of the speculative loop's two model calls, run back to back.

  One pair is `draft.propose` of `gamma` tokens, then `target.score` of the
  chunk [last token, proposals], both states rewound to `position` after it:
  an iteration's model work without its rejection rule, writes and records.
  Beside `draft_token_time` and `target_step_times` (each call alone), it
  shows what running the two models together costs beyond their sum (their
  weights evicting each other from the caches).

  Args:
    target: the target's scorer.
    draft: any `drafts.Draft` with the target's vocabulary.
    inputs: int32 `[batch, input_len]`, what `target.encode` takes.
    gamma: proposals per call.
    warp: the sampling settings proposals are drawn with.
    cache_len: positions of both states (as in the decoders).
    position: tokens already generated at each pair.
    calls: pairs per jitted loop.
    repeats: timed loop runs (the median is used).
    draft_inputs: int32 `[batch, draft_input_len]`, what `draft.init_state`
      takes (default `inputs`).
    seed: PRNG seed of the proposals.

  Returns:
    `StepTimes` with seconds per pair.
  """
  if position + gamma + 2 > cache_len:
    raise ValueError(f"position={position} + gamma={gamma} + 2 must fit in cache_len={cache_len}.")
  context = target.encode(inputs)
  target_state = initial_state(target, context, cache_len)
  draft_state = draft.init_state(inputs if draft_inputs is None else draft_inputs, cache_len,
                                 target_encoded_for(draft, target, inputs))
  batch = inputs.shape[0]
  lengths = jnp.full((batch,), position, jnp.int32)
  tokens = jnp.ones((batch, cache_len + 1), jnp.int32)
  rng = jax.random.PRNGKey(seed)
  return _per_call(
      lambda: pair_loop(target, draft, target_state, draft_state, tokens, lengths, rng,
                        gamma=gamma, warp=warp, calls=calls), calls, repeats)


@functools.partial(programs.loop_jit, static_argnames=("gamma", "warp", "calls"))
def pair_loop(target: Scorer, draft: Draft, target_state: Any, draft_state: Any, tokens: Array,
              lengths: Array, rng: Array, *, gamma: int, warp: Warp, calls: int) -> Array:
  """Runs `calls` propose-then-score pairs from the same states; returns a scalar using all."""

  def body(i, carry):
    target_state, draft_state, acc = carry
    draft_state, proposals, _ = draft.propose(draft_state, tokens, lengths,
                                              jax.random.fold_in(rng, i), gamma=gamma,
                                              warp=warp)
    chunk = jnp.concatenate([tokens[:, :1], proposals], axis=1)  # [batch, gamma + 1]
    target_state = target.rewind(target_state, lengths)
    if draft.reads_target_features:
      logits, features, target_state = target.score_with_features(target_state, chunk)
    else:
      (logits, target_state), features = target.score(target_state, chunk), None
    return (target_state, draft.commit(draft_state, lengths, tokens, features),
            acc + logits[:, -1, 0].sum())

  zero = jnp.zeros((), jnp.float32)
  return jax.lax.fori_loop(0, calls, body, (target_state, draft_state, zero))[2]



DEFAULT_TIMING_ROUNDS = 11


def timing_geometry(max_decode_len: int, max_gamma: int) -> tuple[int, int]:
  """(cache_len, position) of step timings: the speculative decoder's cache, scored halfway."""
  return max_decode_len + max_gamma + 1, max_decode_len // 2


@dataclasses.dataclass(frozen=True)
class VerifyTimes:
  """The target's cached calls of k = 1..max_gamma + 1 tokens, timed in rounds.

  Other tenants of a shared CPU slow every call by a factor that changes from
  one loop of a few milliseconds to the next: on the 2-core cloud CPU one
  k's rounds spread by up to 70%. A median per k then mixes different moments'
  factors into the ratios between k (T_verify(2) once read 0.71 T_step, and
  gamma = 'auto' chose 3 where 1 was fastest). So the shape is read from each
  k's fastest round, the one least slowed, and the level from T_step's median,
  which is what the decoders pay on average.

  Attributes:
    t_step: T_step, seconds per one-token call, the median over rounds.
    fastest: {k: seconds per call in k's fastest round}.
    spread: {k: (slowest - fastest round) / median}: the timing's noise.
    rounds: the rounds timed.
    compile_s: compile time of the timing loops.
  """

  t_step: float
  fastest: Mapping[int, float]
  spread: Mapping[int, float]
  rounds: int
  compile_s: float

  @property
  def t_chunk(self) -> dict[int, float]:
    """{k: seconds per call scoring k tokens}: T_step times fastest[k] / fastest[1]."""
    return {k: self.t_step * t / self.fastest[1] for k, t in self.fastest.items()}

  def fitted(self, max_gamma: int) -> dict[int, float]:
    """{k: T_verify(k)} for k = 1..max_gamma + 1 with the ratios to T_step fitted
    non-decreasing in k over those k alone (`gamma_choice.fitted_ratios`), as
    `make_choice` fits them."""
    ratios = {k: self.fastest[k] / self.fastest[1] for k in range(1, max_gamma + 2)}
    return {k: self.t_step * r for k, r in fitted_ratios(ratios).items()}


def verify_times(target: Scorer, inputs: Array, *, max_gamma: int, max_decode_len: int,
                 calls: int, repeats: int, rounds: int = DEFAULT_TIMING_ROUNDS) -> VerifyTimes:
  """Times T_verify(k) (`target.score` of k tokens), k = 1..max_gamma + 1, at the batch
  size of `inputs`, in `rounds` rounds (k ascending, then descending, ...).

  Args:
    target: the target's scorer.
    inputs: int32 `[batch, input_len]`, what `target.encode` takes.
    max_gamma: the largest gamma to price (sets the cache length too).
    max_decode_len: the decoders' output length (sets the cache length).
    calls: calls per timed loop.
    repeats: timed runs per loop and round (the median is used).
    rounds: rounds over every k (T_step's median and each k's fastest are used).
  """
  cache_len, position = timing_geometry(max_decode_len, max_gamma)
  ks = list(range(1, max_gamma + 2))
  timed = [target_step_times(
      target, inputs, chunk_lengths=ks[::-1] if r % 2 else ks,
      cache_len=cache_len, position=position, calls=calls, repeats=repeats)
      for r in range(rounds)]
  seconds = {k: [t[k].seconds for t in timed] for k in ks}
  median = {k: float(np.median(s)) for k, s in seconds.items()}
  return VerifyTimes(
      t_step=median[1], fastest={k: float(min(s)) for k, s in seconds.items()},
      spread={k: (max(s) - min(s)) / median[k] for k, s in seconds.items()},
      rounds=rounds, compile_s=sum(t.compile_s for t in timed[0].values()))


def draft_time(draft: Draft, inputs: Array, *, gamma: int, warp: Warp, max_decode_len: int,
               max_gamma: int, calls: int, repeats: int, seed: int, target: Scorer
               ) -> StepTimes:
  """T_draft: seconds per proposed token at this gamma and sampling setting (the target
  encodes `inputs` first, outside the timing, for a draft that reads its encoder)."""
  cache_len, position = timing_geometry(max_decode_len, max_gamma)
  return draft_token_time(
      draft, inputs, gamma=gamma, warp=warp, cache_len=cache_len, position=position,
      calls=calls, repeats=repeats, seed=seed,
      target_encoded=target_encoded_for(draft, target, inputs))


# `time_sequence_work`'s times already taken for one target and draft: {(cache length,
# repeats, the batches' shapes and bytes): (the target's seconds, the draft's)}.
SequenceWork = dict[tuple, tuple[float, float]]


def time_sequence_work(target: Scorer, draft: Draft, batches: Sequence[Array], *,
                       cache_len: int, repeats: int, taken: SequenceWork | None = None
                       ) -> tuple[float, float]:
  """Both models' work once per sequence: `LoopCosts.encode_target_s` and `encode_draft_s`.

  The target's `encode` and the arrays its `init_state` makes
  (`state_arrays`: an empty cache; a decoder-only target's prefill),
  the draft's `init_state`, each timed `repeats` times per batch (the median).

  Args:
    target: the target's scorer.
    draft: the draft.
    batches: int32 `[batch, input_len]` checked batches, cut to their length bucket.
    cache_len: the decoders' cache length.
    repeats: timed calls of each.
    taken: times this target and draft already took (`SequenceWork`, filled in): the
      same batches at the same cache length are not timed again. Neither temperature
      nor gamma enters this work, so the points of one task share it.

  Returns:
    Seconds per batch of the target's work and of the draft's, the means over
    `batches` (their lengths differ, and the encoders' cost with them).
  """
  if taken is not None:
    # Whole on every process (a collective, as every process times the same batches), so
    # that all of them find the same times taken, and run the same programs.
    key = (cache_len, repeats,
           tuple((x.shape, x.tobytes()) for x in distributed.fetch(list(batches))))
    if key in taken:
      return taken[key]
  init_draft = jax.jit(lambda d, x, encoded: d.init_state(x, cache_len, encoded))
  encode_target = encode_draft = 0.0
  for x in batches:
    context = target.encode(x)
    encode_target += (
        time_calls(lambda x=x: target.encode(x), repeats).median_s
        + time_calls(lambda c=context: state_arrays(
            target, c, cache_len=cache_len), repeats).median_s) / len(batches)
    encoded = target_encoded_for(draft, target, x)
    encode_draft += time_calls(
        lambda x=x, e=encoded: init_draft(draft, x, e), repeats).median_s / len(batches)
  if taken is not None:
    taken[key] = (encode_target, encode_draft)
  return encode_target, encode_draft


# One pass over a few held-out examples takes T5's loops a fraction of a second, too
# short to fit the loops' own work from; SmolLM2's takes seconds and stays one pass.
LOOP_COST_MIN_S = 1.0
LOOP_COST_MAX_PASSES = 8


def measure_loop_costs(target: Scorer, draft: Draft, batches: Sequence[Array], *, gamma: int,
                       warp: Warp, max_decode_len: int, eos_id: int,
                       t_chunk: Mapping[int, float], t_draft: float, rng: Array, repeats: int,
                       held_out: bool, slope_gamma: int | None = None,
                       sequence_work: SequenceWork | None = None
                       ) -> tuple[LoopCosts, AlphaEstimate]:
  """Times both models' work once per sequence and the decodings of the batches by each
  decoder (after one untimed call per batch shape; one pass over them, or as many, up to
  `LOOP_COST_MAX_PASSES`, as take each decoder `LOOP_COST_MIN_S`, and the median pass),
  and attributes to overhead what the model calls leave.

  With `slope_gamma`, the speculative decoder also decodes at that gamma, and
  its iteration overhead is split into a fixed part and a part per proposal:
  the line through the two gammas' overheads. Without, the whole overhead is
  per iteration. Every term is fitted >= 0 (`loop_work.fit_loop_work`: flat
  at the two overheads' mean for a falling line, through the origin for one
  that would start below it); a term the unconstrained fit wanted negative is
  recorded with the residual (`LoopCosts.misfit`, in T_step units).

  The target's work once per sequence is `encode` and the arrays `init_state`
  makes (`state_arrays`: an empty cache; a decoder-only target's
  prefill), the draft's its `init_state`.

  Args:
    target: the target's scorer.
    draft: the draft.
    batches: int32 `[batch, input_len]` batches to decode, checked against the
      vocabulary (`validation.check_token_ids`) and cut to their length bucket:
      the decoders here (`baseline.decode`, `speculative.speculative_decode`)
      take them as they are.
    gamma: the speculative decoder's gamma.
    warp: the sampling settings.
    max_decode_len: the most tokens per row.
    eos_id: the end-of-sequence id.
    t_chunk: {k: T_verify(k)}, k = 1 being T_step.
    t_draft: the draft's seconds per proposed token.
    rng: PRNG key of the decodings.
    repeats: timed calls of each model's once-per-sequence work (the median is used).
    held_out: recorded: whether `batches` lie outside the measured examples.
    slope_gamma: a second gamma to decode at (with `t_chunk[slope_gamma + 1]`),
      or None.
    sequence_work: the once-per-sequence times already taken (`time_sequence_work`'s
      `taken`), or None.

  Returns:
    The `LoopCosts`, and alpha pooled over the speculative decodings at `gamma`.
  """
  kwargs = dict(max_decode_len=max_decode_len, warp=warp, eos_id=eos_id)
  gammas = sorted({gamma} if slope_gamma is None else {gamma, slope_gamma})
  decoders = {"baseline": lambda i: baseline.decode(target, batches[i], rng, **kwargs)}
  for g in gammas:
    decoders[f"gamma={g}"] = lambda i, g=g: speculative.speculative_decode(
        target, draft, batches[i], rng, gamma=g, draft_inputs=batches[i], **kwargs)
  timings, outputs = time_interleaved(
      decoders, len(batches), 1, fetch=distributed.fetch,
      warmup=first_of_each_shape(batches), min_s=LOOP_COST_MIN_S,
      max_passes=LOOP_COST_MAX_PASSES)
  n = len(batches)
  encode_target, encode_draft = time_sequence_work(
      target, draft, batches, cache_len=timing_geometry(max_decode_len, gammas[-1])[0],
      repeats=repeats, taken=sequence_work)
  steps = sum(int(np.max(o.lengths)) for o in outputs["baseline"])
  overhead = {}  # {gamma: seconds per iteration beyond the model calls}
  for g in gammas:
    iterations = sum(int(o.stats.loop_iterations) for o in outputs[f"gamma={g}"])
    overhead[g] = ((timings[f"gamma={g}"].median_s - n * (encode_target + encode_draft))
                   / max(iterations, 1) - (g * t_draft + t_chunk[g + 1]))
  work = fit_loop_work(
      (timings["baseline"].median_s - n * encode_target) / max(steps, 1) - t_chunk[1], overhead)
  costs = LoopCosts(
      encode_target_s=encode_target, encode_draft_s=encode_draft, step_overhead_s=work.step_s,
      iteration_overhead_s=work.iteration_s, batches=n, held_out=held_out,
      loop_tokens=steps / n, proposal_overhead_s=work.proposal_s,
      misfit={name: value / t_chunk[1] for name, value in work.misfit.items()},
      misfit_residual=work.residual_s / t_chunk[1])
  return costs, pooled_alpha(outputs[f"gamma={gamma}"], gamma)


DEFAULT_CALIBRATION_GAMMA = 3
_AGREED_LOOP_COSTS = ("encode_target_s", "encode_draft_s", "step_overhead_s",
                      "iteration_overhead_s", "loop_tokens", "proposal_overhead_s")


def second_gamma(calibration_gamma: int, max_gamma: int) -> int | None:
  """The second gamma a calibration decodes at (`measure_loop_costs`' slope_gamma): 1,
  2 when calibrating at 1, or None when max_gamma leaves no other."""
  other = 1 if calibration_gamma > 1 else 2
  return other if other <= max_gamma else None


def calibrate(target: Scorer, draft: Draft, batches: Sequence[Array], *, warp: Warp,
              max_decode_len: int, max_gamma: int, eos_id: int, rng: Array,
              verify: VerifyTimes, calibration_gamma: int = DEFAULT_CALIBRATION_GAMMA,
              timing_calls: int = 8, timing_repeats: int = 3, alpha: float | None = None,
              sequence_work: SequenceWork | None = None) -> GammaChoice:
  """The one calibration: measures what the whole cost model needs and chooses gamma.

  Times the draft's proposals at `calibration_gamma` and both decoders over
  `batches`, the speculative one at `calibration_gamma` and at `second_gamma`'s
  (`measure_loop_costs`: alpha, the loops' own work per step, per iteration and
  per proposal, the encoders); the target's T_verify(k) come from `verify`.
  Every process decides from process 0's times (`distributed.agreed`, a collective; in
  one process the times are unchanged), so that all choose one gamma.
  Arguments are the checked ones of `choose_gamma` (or of `experiments.run`'s
  settings). No timing guard runs here: the caller wraps
  the call in `contention.quiet` and records its check in the choice
  (`GammaChoice.idle_check`, None here).

  Args:
    target: the target's scorer.
    draft: the draft.
    batches: int32 `[batch, input_len]` calibration batches at the batch size
      that will be decoded (step costs depend on it), checked and bucketed as
      `measure_loop_costs` takes them.
    warp: the sampling settings that will be decoded with.
    max_decode_len: the most tokens per row, as will be decoded.
    max_gamma: candidates are gamma = 1..max_gamma.
    eos_id: the end-of-sequence id.
    rng: PRNG key of the calibration's decodings.
    verify: the target's T_verify(k) for k = 1..max_gamma + 1 at this batch size.
    calibration_gamma: gamma of the calibration's decodings and draft timing.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).
    alpha: the acceptance rate to decide with, if known (the measured one is
      otherwise used).
    sequence_work: the once-per-sequence times already taken (`time_sequence_work`'s
      `taken`), or None.

  Returns:
    The `GammaChoice`, its `idle_check` None.
  """
  start = time.perf_counter()
  t_chunk = verify.fitted(max_gamma)
  t_draft = draft_time(draft, batches[0], gamma=calibration_gamma, warp=warp,
                       max_decode_len=max_decode_len, max_gamma=max_gamma, calls=timing_calls,
                       repeats=timing_repeats, seed=0, target=target).seconds
  slope_gamma = second_gamma(calibration_gamma, max_gamma)
  loop_costs, estimate = measure_loop_costs(
      target, draft, batches, gamma=calibration_gamma, warp=warp,
      max_decode_len=max_decode_len, eos_id=eos_id, t_chunk=t_chunk, t_draft=t_draft,
      rng=rng, repeats=timing_repeats, held_out=True, slope_gamma=slope_gamma,
      sequence_work=sequence_work)
  ks = sorted(verify.t_chunk)
  values = distributed.agreed([verify.t_chunk[k] for k in ks] + [t_draft]
                              + [getattr(loop_costs, n) for n in _AGREED_LOOP_COSTS])
  t_chunk = dict(zip(ks, values[:len(ks)], strict=True))
  t_draft = values[len(ks)]
  loop_costs = dataclasses.replace(loop_costs, **dict(zip(
      _AGREED_LOOP_COSTS, values[len(ks) + 1:], strict=True)))
  return make_choice(estimate if alpha is None else alpha, t_chunk, t_draft,
                     loop_costs=loop_costs, spread=verify.spread, max_gamma=max_gamma,
                     calibration_s=time.perf_counter() - start)


def choose_gamma(target: Scorer, draft: Draft, inputs: Array, *, max_decode_len: int,
                 eos_id: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 max_gamma: int = DEFAULT_MAX_GAMMA, alpha: float | None = None,
                 calibration_gamma: int = DEFAULT_CALIBRATION_GAMMA, timing_calls: int = 8,
                 timing_repeats: int = 3, timing_rounds: int = DEFAULT_TIMING_ROUNDS,
                 rng: Array | None = None) -> GammaChoice:
  """gamma = 'auto': calibrates on `inputs` and returns the gamma the whole cost model
  predicts to be fastest, for any target scorer and draft (checked entry point).

  Times the target's T_verify(k) (`verify_times`), then runs `calibrate`. Compilation
  dominates: on the 2-core CPU, for the shipped family, expect tens of seconds. Time it
  on a quiet machine: the guard is the caller's (`with contention.quiet("calibration")
  as guard:`; `guard.record()` after the block), and `choice.idle_check` is None.

  Args:
    target: the target's `Scorer` (e.g. `T5Scorer(model, model.prepare(params))`, a
      `LlamaScorer`).
    draft: the draft, with the target's vocabulary.
    inputs: int32 `[batch, input_len]` calibration examples at the batch size you will
      decode with (step costs depend on it): a few suffice.
    max_decode_len: the most tokens per row, as you will decode.
    eos_id: the end-of-sequence id.
    temperature: the sampling temperature (0 = greedy), as you will decode.
    top_k: as you will decode (0 = off).
    top_p: as you will decode (1.0 = off).
    max_gamma: candidates are gamma = 1..max_gamma.
    alpha: the acceptance rate to decide with, if known (e.g. from the draft's model
      card; the calibration still decodes, to time the loops).
    calibration_gamma: gamma of the calibration's decodings and of the draft timing, in
      1..max_gamma.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).
    timing_rounds: rounds over every k of T_verify(k) (`verify_times`).
    rng: PRNG key of the calibration's decodings (default `PRNGKey(0)`).

  Returns:
    The `GammaChoice`; `choice.gamma` goes to `generate.speculative_sample(gamma=...)`.

  Raises:
    ValueError: naming the bad argument, before any work.
  """
  args = validation.check_scorer_speculative_args(
      target, draft, inputs, gamma=calibration_gamma, draft_inputs=None,
      max_decode_len=max_decode_len, eos_id=eos_id, temperature=temperature, top_k=top_k,
      top_p=top_p, rng=rng)
  max_gamma = validation.as_int("max_gamma", max_gamma, minimum=1,
                                what="candidates are gamma = 1..max_gamma")
  if args.gamma > max_gamma:
    raise ValueError(f"calibration_gamma={args.gamma} must lie in 1..max_gamma="
                     f"{max_gamma}; lower it or raise max_gamma.")
  if alpha is not None:
    alpha = check_alpha(alpha)
  calls = validation.as_int("timing_calls", timing_calls, minimum=1, what="calls per timed loop")
  repeats = validation.as_int("timing_repeats", timing_repeats, minimum=1,
                              what="timed runs per loop")
  rounds = validation.as_int("timing_rounds", timing_rounds, minimum=1,
                             what="rounds over every k")
  start = time.perf_counter()
  batch = buckets.to_bucket(args.inputs)
  verify = verify_times(target, batch, max_gamma=max_gamma, max_decode_len=args.max_decode_len,
                        calls=calls, repeats=repeats, rounds=rounds)
  choice = calibrate(target, draft, [batch], warp=Warp.of(args),
                     max_decode_len=args.max_decode_len, max_gamma=max_gamma,
                     eos_id=args.eos_id, rng=args.rng, verify=verify,
                     calibration_gamma=args.gamma, timing_calls=calls, timing_repeats=repeats,
                     alpha=alpha)
  return dataclasses.replace(choice, calibration_s=time.perf_counter() - start)


class Guard(Protocol):
  """What `time_point` asks of a timing guard (`contention.quiet(what)` is one): a
  context manager whose value records its check."""

  def __call__(self, what: str) -> contextlib.AbstractContextManager[Any]: ...


@dataclasses.dataclass
class SharedCosts:
  """What a point's timing measures once and later points may share, filled in as it is
  measured, so that a point retried after a timing refused as noisy redoes only what failed.

  Attributes:
    verify: the target's T_verify(k) at the point's batch size (`verify_times`), None
      until measured.
    verify_check: the guard's record of their timing.
    choice: gamma = 'auto''s choice for the point (`calibrate`), None until made or at a
      fixed gamma.
    sequence_work: both models' once-per-sequence times (`time_sequence_work`) for the
      point's draft, filled in; the points of one draft and batch size share one.
  """

  verify: VerifyTimes | None = None
  verify_check: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  choice: GammaChoice | None = None
  sequence_work: SequenceWork = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PointSetup:
  """How a point is timed.

  Attributes:
    gamma: the speculative decoder's gamma, or None for gamma = 'auto' (`calibrate` on
      the held-out batches, up to `auto_max_gamma`).
    warp: the sampling settings.
    max_decode_len: the most tokens per row.
    max_gamma: the largest gamma of the run (sets the timing cache length and the k of
      T_verify(k)).
    auto_max_gamma: gamma = 'auto''s largest candidate.
    eos_id: the end-of-sequence id.
    passes: timed passes of both decoders over the batches.
    timing_calls: calls per timed step loop.
    timing_repeats: timed runs per step loop (the median is used).
    timing_rounds: rounds over every k of T_verify(k).
    seed: the seed of the step timings, the calibration decodings and the decoders' keys.
    enforce_greedy: at temperature 0, raise when the speculative tokens differ from the
      baseline's (else recorded: `DecodersTiming.greedy_identical`).
  """

  gamma: int | None
  warp: Warp
  max_decode_len: int
  max_gamma: int
  auto_max_gamma: int
  eos_id: int
  passes: int
  timing_calls: int
  timing_repeats: int
  timing_rounds: int
  seed: int
  enforce_greedy: bool = True


@dataclasses.dataclass(frozen=True)
class PointTiming:
  """The whole timing record of one measured point (`time_point`).

  Attributes:
    gamma: the gamma decoded at (gamma = 'auto''s choice, or the point's).
    decoders: both decoders timed against each other, per generated token
      (`time_decoders`).
    verify: the target's T_verify(k) (`SharedCosts.verify`).
    verify_check: the guard's record of their timing.
    choice: gamma = 'auto''s choice, None at a fixed gamma.
    draft_cost: T_draft at `gamma`, seconds per proposed token.
    loop_costs: the loops' own work, the encoders on the measured batches and N.
    idle_check: the guard's record of the decoders' and the draft's timing.
    phases_s: where the point's wall-clock seconds went, apart (guards included):
      "compile" (every program JAX compiled for the point, `compiling`),
      "calibration" (the cost model's timings: T_verify(k), gamma = 'auto''s
      calibration, T_draft, the loops' own work, the encoders) and "measurement"
      (the decoders' interleaved timing), each less its compilation.
    environment: where it ran (`environment`, with the target's decode options).
  """

  gamma: int
  decoders: DecodersTiming
  verify: VerifyTimes
  verify_check: Mapping[str, Any]
  choice: GammaChoice | None
  draft_cost: StepTimes
  loop_costs: LoopCosts
  idle_check: Mapping[str, Any]
  phases_s: Mapping[str, float]
  environment: dict[str, Any]


def time_point(target: Scorer, draft: Draft, batches: Sequence[Array],
               held_out: Sequence[Array], setup: PointSetup, shared: SharedCosts, *,
               guard: Guard, what: str) -> PointTiming:
  """Times one point: the baseline against speculative decoding over `batches`, and every
  cost the row's cost model is made of.

  In order, each inside its own `guard`: the target's T_verify(k) (`verify_times`, unless
  `shared` has them), gamma = 'auto''s calibration on `held_out` (`calibrate`, unless
  `shared` has the choice), then both decoders interleaved (`time_decoders`), T_draft at
  the gamma decoded (`draft_time`), the loops' own work (`measure_loop_costs` on
  `held_out`, or the first batch; the calibration's own when it timed them) and the
  encoders on the measured batches (`time_sequence_work`, unless `shared` has them for
  these batches). `shared` is filled in as each is measured. The record ends with where
  it ran (`environment`).

  Args:
    target: the target's scorer.
    draft: the draft, checked against the target.
    batches: int32 `[batch, input_len]` measured batches, checked and cut to their
      length bucket.
    held_out: batches of the same shape outside the measured examples (calibration and
      loop costs); may be empty at a fixed gamma.
    setup: how the point is timed.
    shared: what earlier points measured that this one shares; filled in.
    guard: the timing guard (`contention.quiet`).
    what: the point's name, for the guards and a greedy refusal.

  Returns:
    The `PointTiming`.

  Raises:
    RuntimeError: at temperature 0 the speculative tokens differ from the baseline's and
      `setup.enforce_greedy`.
  """
  watch = Stopwatch()
  if shared.verify is None:
    with watch("costs"), guard("target step times") as checked:
      verify = verify_times(target, batches[0], max_gamma=setup.max_gamma,
                            max_decode_len=setup.max_decode_len, calls=setup.timing_calls,
                            repeats=setup.timing_repeats, rounds=setup.timing_rounds)
    shared.verify, shared.verify_check = verify, checked.record()
  # Times taken inside a guard are kept once it has passed them.
  work = dict(shared.sequence_work)
  if setup.gamma is None and shared.choice is None:
    with watch("costs"), guard("gamma calibration") as checked:
      choice = calibrate(
          target, draft, held_out, warp=setup.warp, max_decode_len=setup.max_decode_len,
          max_gamma=setup.auto_max_gamma, eos_id=setup.eos_id,
          rng=jax.random.PRNGKey(setup.seed), verify=shared.verify,
          calibration_gamma=min(DEFAULT_CALIBRATION_GAMMA, setup.auto_max_gamma),
          timing_calls=setup.timing_calls, timing_repeats=setup.timing_repeats,
          sequence_work=work)
    shared.sequence_work.update(work)
    shared.choice = dataclasses.replace(choice, idle_check=types.MappingProxyType(
        checked.record()))
  choice = shared.choice if setup.gamma is None else None
  gamma = choice.gamma if choice is not None else setup.gamma
  kwargs = dict(max_decode_len=setup.max_decode_len, warp=setup.warp, eos_id=setup.eos_id)
  decoders = {
      "baseline": lambda batch, key: baseline.decode(target, batch, key, **kwargs),
      "speculative": lambda batch, key: speculative.speculative_decode(
          target, draft, batch, key, gamma=gamma, draft_inputs=batch, **kwargs)}
  with guard(what) as checked:
    with watch("decoders"):
      decoded = time_decoders(decoders, batches, passes=setup.passes, seed=setup.seed,
                              temperature=setup.warp.temperature,
                              enforce_greedy=setup.enforce_greedy, what=what)
    with watch("costs"):
      draft_cost, loop_costs, encoders = _point_costs(
          target, draft, batches, held_out, setup, gamma, choice, shared.verify, work)
  shared.sequence_work.update(work)
  # Tokens per batch as the loops run them, on the measured examples: until the longest
  # row ends.
  loop_costs = dataclasses.replace(
      loop_costs, encode_target_s=encoders[0], encode_draft_s=encoders[1],
      loop_tokens=float(np.mean([int(np.max(o.lengths))
                                 for o in decoded.outputs["baseline"]])))
  spans = watch.spans
  phases = {"compile": sum(span.compile_s for span in spans.values()),
            "calibration": spans["costs"].rest_s, "measurement": spans["decoders"].rest_s}
  return PointTiming(gamma, decoded, shared.verify, shared.verify_check, choice, draft_cost,
                     loop_costs, checked.record(), types.MappingProxyType(phases),
                     environment(target.decode_options.provenance()))


def _point_costs(target: Scorer, draft: Draft, batches: Sequence[Array],
                 held_out: Sequence[Array], setup: PointSetup, gamma: int,
                 choice: GammaChoice | None, verify: VerifyTimes, work: SequenceWork
                 ) -> tuple[StepTimes, LoopCosts, tuple[float, float]]:
  """`time_point`'s costs after the decoders: T_draft at `gamma`, the loops' own work and
  the encoders on the measured batches (seconds per batch: the target's, the draft's;
  `work` the once-per-sequence times already taken, filled in)."""
  draft_cost = draft_time(draft, batches[0], gamma=gamma, warp=setup.warp,
                          max_decode_len=setup.max_decode_len, max_gamma=setup.max_gamma,
                          calls=setup.timing_calls, repeats=setup.timing_repeats,
                          seed=setup.seed, target=target)
  if choice is not None and choice.loop_costs is not None:
    # The calibration timed them just now, on held-out batches at this temperature and
    # at two gammas: timing them again would decode the same batches with the same
    # programs.
    loop_costs = choice.loop_costs
  else:
    loop_costs, _ = measure_loop_costs(
        target, draft, list(held_out) or list(batches[:1]), gamma=gamma, warp=setup.warp,
        max_decode_len=setup.max_decode_len, eos_id=setup.eos_id,
        t_chunk=verify.t_chunk, t_draft=draft_cost.seconds,
        rng=jax.random.PRNGKey(setup.seed), repeats=setup.timing_repeats,
        held_out=bool(held_out), sequence_work=work)
  # The once-per-sequence work at the measured examples' own lengths: the few held-out
  # batches' lengths need not be theirs (man-page inputs run from 16 to 128 tokens).
  encoders = time_sequence_work(target, draft, batches, repeats=setup.timing_repeats,
                                cache_len=timing_geometry(setup.max_decode_len, gamma)[0],
                                taken=work)
  return draft_cost, loop_costs, encoders


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _cpu_vectors() -> str:
  """The widest x86 vector extension the CPU reports ("avx512f", "avx2", ...), else "".

  The model name of a VM's CPU ("AMD EPYC") does not tell Zen 3 from Zen 4;
  this does, and it decides panel_dot's code and speed.
  """
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")),
                   [])
  except OSError:
    return ""
  return next((isa for isa in ("avx512f", "avx2", "avx", "sse4_2") if isa in flags), "")


@functools.cache
def _git_commit() -> str | None:
  """The commit of the checkout this package runs from, "+changes" if its code differs
  from it; None outside a git checkout (an installed wheel). Read once per process: the
  code a process runs is what it imported."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    changed = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "specdec_jax"],
                             capture_output=True, text=True, check=True, timeout=10).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  return head + ("+changes" if changed.strip() else "")


def environment(model: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """Where a measurement ran: versions, devices, CPU, load, and the code's git commit.

  Args:
    model: what the measured model records of how it runs, merged in
      (`DecodeOptions.provenance()`: its weight kernel, options and the
      `panel_dot` kernel's status).
  """
  devices = jax.devices()
  env = {
      "jax": jax.__version__,
      "backend": jax.default_backend(),
      "device_kind": devices[0].device_kind,
      "device_count": len(devices),
      "cpu_model": _cpu_model(),
      "cpu_vectors": _cpu_vectors(),
      "cpu_count": os.cpu_count(),
      "python": platform.python_version(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "load_average": list(os.getloadavg()),
      **(model or {}),
  }
  commit = _git_commit()
  if commit:
    env["git_commit"] = commit
  # Optional: recorded when installed, read from its metadata (importing it takes seconds).
  with contextlib.suppress(importlib.metadata.PackageNotFoundError):
    env["torch"] = importlib.metadata.version("torch")
  return env
