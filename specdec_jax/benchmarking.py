"""The timing harness: compared decoders interleaved, per-call step times, the environment.

Every timing in the project goes through here. Decoders that are compared
(baseline against speculative, ours against transformers') are timed by
`time_interleaved`: the first call of each is timed apart (compilation), then
every pass calls all of them on every batch in an order rotated per batch and
pass, so background load hits all alike, and medians over passes are taken.
Step times feed `theory.CostModel`; each is the per-call time of a jitted
`lax.fori_loop` over `calls` calls, so Python dispatch and host round-trips are
excluded, as they are inside the decoders' while loops. They time the
interfaces the loops call, for any model: `Scorer.score` (the target) and
`Draft.propose`. The machine must be
quiet meanwhile: callers wrap timings in `specdec_jax.contention.quiet`.
No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.programs import loop_jit
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Context, EncoderOutputs, Scorer

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
    first_s: its first calls, one per warm-up batch (compilation included).
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
    """The first calls less the median later calls on the same batches."""
    steady = sum(statistics.median(calls[i] for calls in self.calls_s) for i in self.warmup)
    return max(sum(self.first_s) - steady, 0.0)


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
                     warmup: Sequence[int] = (0,)
                     ) -> tuple[dict[str, DecoderTiming], dict[str, list]]:
  """Times decoders against each other over the same batches.

  Each decoder's first calls, on the `warmup` batches (one per compiled
  program: batches of another shape compile their own), are timed apart. Then,
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

  Returns:
    {name: DecoderTiming}, and the first pass's fetched outputs per decoder (a
    list over batches).
  """
  if passes < 1:
    raise ValueError(f"passes must be >= 1, got {passes}.")
  if not warmup or not all(0 <= i < num_batches for i in warmup):
    raise ValueError(f"warmup must list batch indices in [0, {num_batches}), got {warmup}.")
  names = list(decoders)
  first = {name: tuple(timed(lambda fn=fn, i=i: fn(i))[0] for i in warmup)
           for name, fn in decoders.items()}
  calls_s: dict[str, list[list[float]]] = {name: [] for name in names}
  outputs: dict[str, list] = {name: [] for name in names}
  for rep in range(passes):
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
  timings = {name: DecoderTiming(first[name], tuple(tuple(c) for c in calls_s[name]),
                                 tuple(warmup))
             for name in names}
  return timings, outputs


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


@functools.partial(loop_jit, static_argnames=("calls",))
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


@functools.partial(loop_jit, static_argnames=("gamma", "warp", "calls"))
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


@functools.partial(loop_jit, static_argnames=("gamma", "warp", "calls"))
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
  try:
    import torch  # noqa: PLC0415  (optional: only recorded when installed)
    env["torch"] = torch.__version__
  except ImportError:
    pass
  return env
