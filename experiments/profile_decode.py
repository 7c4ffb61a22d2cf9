r"""Where the time of one decoder step and one speculative iteration goes, op by op.

Runs the shipped target's one-token step (k = 1), its verification of gamma + 1
tokens, and the shipped draft's proposal step under `jax.profiler` with XLA:CPU's
per-op trace events (`--xla_cpu_enable_xprof_traceme=true`, set before JAX
starts), each inside a jitted loop of `--calls` calls as the decoders run them.
Every op of the compiled program is put in a category by its HLO (weight dots by
their output shape, attention dots, cache updates, ...) and reported in
microseconds per call. The profiler's own per-op cost inflates small ops, so the
table gives shares as well as the untraced per-call time measured beside it.
Also times the per-example work outside the loop: both encoders at input lengths
16..128 (inputs are padded to `Settings.input_len`).

  python -m experiments.profile_decode [--output_dir=results/profile]

The models directory, gamma and the lengths are the shared `Settings` (gin).

Writes `profile.json` and `profile.md`.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_enable_xprof_traceme=true").strip()

import collections  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from specdec_jax import atomic_io, benchmarking, contention  # noqa: E402
from specdec_jax.checkpoints import load_hf_checkpoint  # noqa: E402
from specdec_jax.decoding.sampling import Warp  # noqa: E402
from specdec_jax.harness import gin_flags, settings  # noqa: E402
from specdec_jax.models.t5 import (  # noqa: E402
    T5Model,
    T5Scorer,
    make_draft,
)

_DRAFT = flags.DEFINE_string("draft", "draft_small", "The draft whose proposals are profiled.")
_CALLS = flags.DEFINE_integer("calls", 32, "Calls per jitted loop.", lower_bound=1)
ENCODER_LENGTHS = (16, 32, 64, 128)  # Encoders timed at these input lengths (cut to input_len).
_OUTPUT_DIR = flags.DEFINE_string("output_dir", os.path.join("results", "profile"),
                                  "Where profile.json and profile.md go.")


def categorize(name: str, shape: str, kind: str) -> str:
  """The category of one compiled op, from its HLO name, output shape and opcode."""
  dims = [int(d) for d in re.findall(r"\d+", shape[shape.find("["):shape.find("]")])]
  if kind == "custom-call" and name.startswith("ffi_call"):  # panel_dot's weight products.
    return f"weight dot (panel_dot), output {'x'.join(map(str, dims))}"
  if kind in ("dot", "dot_general") or name.startswith(("dot", "ynn_fusion")):
    if len(dims) == 2:
      return f"weight dot, output {'x'.join(map(str, dims))}"
    return "attention dots (scores, weighted sums)"
  if "dynamic-update-slice" in name or "scatter" in name:
    return "cache updates"
  if "gather" in name or "take" in name:
    return "gathers (embedding, position bias)"
  if "reduce" in name or "rsqrt" in name or "exponential" in name or "divide" in name:
    return "norms and softmax (reductions)"
  if name.startswith("copy"):
    return "copies"
  return "other elementwise / bookkeeping"


def _trace(fn, calls: int, hlo: str) -> dict[str, float]:
  """Microseconds per call of each op category of `fn`'s compiled program."""
  shapes = {}
  for line in hlo.splitlines():
    m = re.match(r"\s*%(\S+) = (\S+) ([\w-]+)\(", line)
    if m:
      shapes[m.group(1)] = (m.group(2), m.group(3))
  directory = tempfile.mkdtemp(prefix="specdec_profile_")
  runs = 3
  jax.profiler.start_trace(directory, create_perfetto_trace=True)
  for _ in range(runs):
    jax.block_until_ready(fn())
  jax.profiler.stop_trace()
  path = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)[0]
  with gzip.open(path) as f:
    events = json.load(f)["traceEvents"]
  out: dict[str, float] = collections.defaultdict(float)
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name not in shapes:
      continue
    shape, kind = shapes[name]
    out[categorize(name, shape, kind)] += e["dur"] / (runs * calls)
  return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _untraced_us(fn, calls: int, repeats: int = 7) -> float:
  jax.block_until_ready(fn())
  return 1e6 * statistics.median(benchmarking.timed(fn)[0] for _ in range(repeats)) / calls


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  shared = settings.load_settings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  if shared.input_len < ENCODER_LENGTHS[0] or shared.max_decode_len < 2:
    raise app.UsageError(f"Settings.input_len={shared.input_len} must be >= "
                         f"{ENCODER_LENGTHS[0]} and Settings.max_decode_len="
                         f"{shared.max_decode_len} >= 2.")
  cfg, params = load_hf_checkpoint(shared.checkpoint_dir(shared.target))
  target = T5Model(cfg)
  prepared = target.prepare(jax.device_put(params))
  dcfg, dparams = load_hf_checkpoint(shared.checkpoint_dir(_DRAFT.value))
  draft_model = T5Model(dcfg)
  draft = make_draft(draft_model, jax.device_put(dparams))
  rng = np.random.RandomState(0)
  inputs = jnp.asarray(rng.randint(5, 8000, (1, shared.input_len)), jnp.int32)
  gamma, calls = shared.gamma, _CALLS.value
  cache_len, position = shared.max_decode_len + gamma + 1, shared.max_decode_len // 2
  scorer = T5Scorer(target, prepared)
  state = benchmarking.initial_state(scorer, scorer.encode(inputs), cache_len)
  start = jnp.full((1,), position, jnp.int32)
  programs = {}
  for k in (1, gamma + 1):
    tokens = jnp.ones((1, k), jnp.int32)
    fn = lambda t=tokens: benchmarking.chunk_loop(scorer, state, t, start, calls=calls)
    hlo = benchmarking.chunk_loop.lower(scorer, state, tokens, start,
                                        calls=calls).compile().as_text()
    programs[f"target, {k} token(s) per call"] = (fn, hlo, calls)
  state = draft.init_state(inputs, cache_len)
  lengths = jnp.full((1,), position, jnp.int32)
  buffer = jnp.ones((1, cache_len + 1), jnp.int32)
  key = jax.random.PRNGKey(0)
  fn = (lambda: benchmarking.propose_loop(
      draft, state, buffer, lengths, key, gamma=gamma, warp=Warp(), calls=calls))
  hlo = benchmarking.propose_loop.lower(
      draft, state, buffer, lengths, key, gamma=gamma, warp=Warp(), calls=calls
  ).compile().as_text()
  programs[f"{_DRAFT.value}, {gamma} proposals per call"] = (fn, hlo, calls)

  result = {"gamma": gamma, "input_len": shared.input_len, "programs": {}, "encoders_ms": {}}
  with contention.quiet("experiments.profile_decode") as guard:
    for name, (fn, hlo, n) in programs.items():
      untraced = _untraced_us(fn, n)
      categories = _trace(fn, n, hlo)
      result["programs"][name] = {"untraced_us_per_call": untraced,
                                  "traced_us_per_call_by_category": categories}
    for length in ENCODER_LENGTHS:
      x = inputs[:, :length]
      for model_name, model, p in (("target", target, prepared),
                                   (_DRAFT.value, draft_model, draft.params)):
        fn = lambda m=model, p=p, x=x: m.encode(p, x)  # noqa: E731
        jax.block_until_ready(fn())
        ms = 1e3 * statistics.median(benchmarking.timed(fn)[0] for _ in range(9))
        result["encoders_ms"].setdefault(model_name, {})[length] = ms
  result["idle_check"] = guard.record()
  result["environment"] = benchmarking.environment()
  result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

  lines = [f"# Decoder step profile (batch 1, fp32, {result['environment']['cpu_model']}, "
           f"jax {jax.__version__})\n", "Command: python -m experiments.profile_decode\n"]
  for name, prog in result["programs"].items():
    traced = sum(prog["traced_us_per_call_by_category"].values())
    lines += [f"\n## {name}: {prog['untraced_us_per_call']:.0f} us per call untraced "
              f"({traced:.0f} us traced)\n", "| category | us per call (traced) | share |",
              "|---|---|---|"]
    lines += [f"| {c} | {us:.0f} | {100 * us / traced:.0f}% |"
              for c, us in prog["traced_us_per_call_by_category"].items() if us >= 0.5]
  lines += ["\n## Encoders, once per example (ms), by input length\n",
            "| model | " + " | ".join(str(n) for n in ENCODER_LENGTHS) + " |",
            "|---|---|---|---|---|"]
  for model_name, by_len in result["encoders_ms"].items():
    lines.append(f"| {model_name} | " + " | ".join(f"{v:.2f}" for v in by_len.values()) + " |")
  text = "\n".join(lines) + "\n"
  atomic_io.write_json(os.path.join(_OUTPUT_DIR.value, "profile.json"), result)
  atomic_io.atomic_write_text(os.path.join(_OUTPUT_DIR.value, "profile.md"), text)
  print(text)


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
