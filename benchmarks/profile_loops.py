r"""The account of one iteration of each decoding loop: every op, by phase and kind.

Compiles the baseline's loop (`baseline.decode`) and the speculative loop
(`speculative.speculative_decode`) with the shipped target and a draft, runs
each on real En-De test prompts (batch 1) untraced and then under the profiler
with XLA:CPU's per-op events (`specdec_jax.costs.profiling.account`), and reports per
iteration (per token for the baseline): the untraced wall time, the op count
and traced time of each (phase, kind), and the traced time between ops.

  python -m benchmarks profile_loops [--drafts=draft_small] [--gammas=1,3,5] \
      [--temperatures=0,1] [--num_examples=4] [--output_dir=results/profile]

The models directory and the lengths are the shared `Settings` (gin). Writes
`loops.json`, `loops.md` and `loops.png` (where an iteration's time goes).
"""

from __future__ import annotations

from specdec_jax.costs import profiling

profiling.enable_op_tracing()  # Before JAX starts its backend.

import os  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import sentencepiece as spm  # noqa: E402
from absl import app, flags  # noqa: E402

from specdec_jax import atomic_io, contention  # noqa: E402
from specdec_jax.costs import timing  # noqa: E402
from specdec_jax.data import prompts  # noqa: E402
from specdec_jax.decoding import acceptance, baseline, speculative  # noqa: E402
from specdec_jax.decoding.sampling import Warp  # noqa: E402
from specdec_jax.experiment import gin_flags, settings  # noqa: E402
from specdec_jax.models.t5 import (  # noqa: E402
  T5Scorer,
  make_draft,
)
from specdec_jax.models.t5.checkpoints import load_model  # noqa: E402

parse_flags = gin_flags.parse_flags  # `python -m benchmarks` parses with it.

_DRAFTS = flags.DEFINE_list("drafts", ["draft_small"], "Drafts whose loops are profiled.")
_GAMMAS = flags.DEFINE_list("gammas", ["1", "3", "5"], "Proposals per iteration.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "1"], "Sampling temperatures.")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 4, "En-De test prompts, run one by one.",
                                     lower_bound=1)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", os.path.join("results", "profile"),
                                  "Where loops.json, loops.md and loops.png go.")


def _loops(shared: settings.Settings) -> dict[str, tuple]:
  """{name: (run all prompts, compiled HLO, iterations per run)} for every loop profiled."""
  target_model, target_params = load_model(shared.checkpoint_dir(shared.target))
  target = T5Scorer(target_model, target_model.prepare(jax.device_put(target_params)))
  processor = spm.SentencePieceProcessor(model_file=prompts.VOCAB_PATH)
  pairs, _ = prompts.load_examples("ende", "test", _NUM_EXAMPLES.value)
  batches = [jnp.asarray(row[None]) for row in prompts.tokenize(
      processor, [x for x, _ in pairs], shared.input_len)]
  eos, max_len = prompts.EOS_ID, shared.max_decode_len
  rng = jax.random.PRNGKey(0)
  loops = {}
  for t in (float(t) for t in _TEMPERATURES.value):
    warp = Warp(t)
    contexts = [target.encode(x) for x in batches]

    def run_baseline(contexts=contexts, warp=warp):
      return [baseline.decode_context(target, c, rng, max_decode_len=max_len,
                                           warp=warp, eos_id=eos) for c in contexts]

    outs = run_baseline()
    steps = sum(int(o.lengths.max()) for o in outs)
    hlo = baseline.decode_context.lower(
        target, contexts[0], rng, max_decode_len=max_len, warp=warp, eos_id=eos
    ).compile().as_text()
    loops[f"baseline, T={t:g}"] = (run_baseline, hlo, steps)
    for name in _DRAFTS.value:
      model, params = load_model(shared.checkpoint_dir(name))
      draft = make_draft(model, jax.device_put(params))
      for gamma in (int(g) for g in _GAMMAS.value):
        kwargs = dict(gamma=gamma, max_decode_len=max_len, warp=warp, eos_id=eos,
                      verify=acceptance.verify)

        def run_spec(contexts=contexts, draft=draft, kwargs=kwargs):
          return [speculative._speculative_sample(target, c, draft, x, rng, **kwargs)  # noqa: SLF001
                  for c, x in zip(contexts, batches, strict=True)]

        outs = run_spec()
        iterations = sum(int(o.stats.loop_iterations) for o in outs)
        hlo = speculative._speculative_sample.lower(  # noqa: SLF001
            target, contexts[0], draft, batches[0], rng, **kwargs).compile().as_text()
        loops[f"{name}, gamma={gamma}, T={t:g}"] = (run_spec, hlo, iterations)
  return loops


def _markdown(result: dict) -> str:
  env = result["environment"]
  lines = [f"# Where an iteration goes (batch 1, fp32, {env['cpu_model']}, jax {env['jax']})\n",
           f"Command: {result['command']}\n",
           "Per iteration of the speculative loop, per token of the baseline's. *wall*: untraced; "
           "the rest traced (the profiler adds its own cost to every op, so shares are the "
           "figure to read). *between ops*: traced time in no op (the runtime's dispatch, "
           "waiting for threads).\n"]
  for name, acc in result["loops"].items():
    lines += [f"\n## {name}: {acc['wall_us']:.0f} us wall, {acc['traced_us']:.0f} us traced, "
              f"{sum(acc['ops'].values()):.0f} ops\n",
              "| phase / kind | ops | us (traced) | share |", "|---|---|---|---|"]
    for key, us in acc["op_us"].items():
      if us >= 0.5:
        lines.append(f"| {key} | {acc['ops'][key]:.1f} | {us:.0f} | "
                     f"{100 * us / acc['traced_us']:.0f}% |")
    lines.append(f"| between ops | | {acc['between_ops_us']:.0f} | "
                 f"{100 * acc['between_ops_us'] / acc['traced_us']:.0f}% |")
  return "\n".join(lines) + "\n"


def _plot(result: dict, path: str) -> None:
  """A stacked bar per loop: traced time per iteration by phase, and between ops."""
  import matplotlib  # noqa: PLC0415  (only this command draws)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  names = list(result["loops"])
  parts = sorted({p for acc in result["loops"].values() for p in acc["by_phase_us"]})
  fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 2.2))
  left = [0.0] * len(names)
  for part in [*parts, "between ops"]:
    widths = [acc["between_ops_us"] if part == "between ops" else acc["by_phase_us"].get(part, 0)
              for acc in result["loops"].values()]
    ax.barh(names, widths, left=left, label=part)
    left = [a + b for a, b in zip(left, widths, strict=True)]
  ax.invert_yaxis()
  ax.set_xlabel("us per iteration (baseline: per token), traced")
  ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.18))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  shared = gin_flags.load_settings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  loops = _loops(shared)
  command = ("python -m benchmarks profile_loops "
             f"--drafts={','.join(_DRAFTS.value)} --gammas={','.join(_GAMMAS.value)} "
             f"--temperatures={','.join(_TEMPERATURES.value)} "
             f"--num_examples={_NUM_EXAMPLES.value}")
  result = {"command": command, "input_len": shared.input_len,
            "max_decode_len": shared.max_decode_len, "num_examples": _NUM_EXAMPLES.value,
            "loops": {}}
  with contention.quiet("profile_loops") as guard:
    for name, (fn, hlo, units) in loops.items():
      result["loops"][name] = profiling.account(fn, hlo, units).to_json()
      print(f"{name}: {result['loops'][name]['wall_us']:.0f} us per iteration")
  result["idle_check"] = guard.record()
  result["environment"] = timing.environment()
  result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
  out = _OUTPUT_DIR.value
  atomic_io.write_json(os.path.join(out, "loops.json"), result)
  atomic_io.atomic_write_text(os.path.join(out, "loops.md"), _markdown(result))
  _plot(result, os.path.join(out, "loops.png"))
  print(_markdown(result))
