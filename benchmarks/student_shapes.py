"""Prices candidate shapes of a decoder-only draft for a GGUF target, before training any.

  python -m benchmarks student_shapes [--target=smollm2] [--repetitions=5] [--grid=projected]

Only alpha needs training; a draft's cost does not. For each shape (layers x width x
shortlist size) a random-weight `models.llama.student` draft is built on the target's
embedding and its seconds per proposed token are timed beside the others. Two grids:
"projected" (the target's embedding projected to a narrower width, tokens only) and
"target_width" (issue 58's EAGLE draft: blocks at the target's width on its own embedding
and tied head rows, reading its features; `StudentConfig.tied_io`), each
(`timing.draft_token_times_rotated`, gamma 4, one row, a 128-token chat prompt);
the target's step and verification times T_verify(k) for k = 1..8 are timed the same
way. Each shape's c = T_draft / T_step then gives, for a few alpha, the speedup
Theorem 3.8 predicts with the measured T_verify(gamma + 1) in place of one step, at
the best gamma <= 7. Compile time is excluded (each program runs once before timing).
The timing runs inside the guard (`contention.quiet`): it refuses a busy machine and
pauses the registered long jobs. Writes `results/smollm2_draft/shapes.json` (or
`shapes_target_width.json`).
"""

from __future__ import annotations

import itertools
import json
import os
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from specdec_jax import atomic_io, contention, theory
from specdec_jax.costs import timing
from specdec_jax.data import chat_prompts, layout
from specdec_jax.decoding.sampling import Warp
from specdec_jax.distillation.teacher import gguf_file
from specdec_jax.models.llama import LlamaModel, LlamaScorer, gguf_loader, pad_prompts
from specdec_jax.models.llama.student import Student, student_config

_TARGET = flags.DEFINE_string("target", "smollm2", "The GGUF target: 'smollm2' or a path.")
_REPETITIONS = flags.DEFINE_integer("repetitions", 5, "Timed runs of each program.")
_GRID = flags.DEFINE_enum("grid", "projected", ["projected", "target_width"],
                          "The shapes: narrower drafts on a projected embedding, or drafts at "
                          "the target's width on its own rows that read its features.")
_OUTPUT = flags.DEFINE_string("output", None, "Where the rows go (default results/"
                              "smollm2_draft/shapes.json, or shapes_target_width.json).")

# (layers, width, shortlist, at the target's width on its own rows reading its features)
GRIDS = {"projected": [(layers, width, head, False) for layers, width, head in
                       itertools.product((1, 2, 3), (128, 192, 256, 384), (4096, 8192))],
         "target_width": [(layers, 576, head, True) for layers, head in
                          itertools.product((1, 2), (4096, 8192))]}
ALPHAS = (0.6, 0.7, 0.8)
GAMMA, PROMPT_LEN, POSITION, CACHE_LEN, CALLS = 4, 128, 32, 48, 8


def _prompt(checkpoint) -> jax.Array:
  """One mansum test prompt, cut to PROMPT_LEN tokens (int32 `[1, PROMPT_LEN]`)."""
  source = chat_prompts.split_sources("mansum", "test", 1)[0]
  ids = chat_prompts.chat_prompt(checkpoint.vocabulary, checkpoint.vocabulary.tokenizer(),
                                 "mansum", source, PROMPT_LEN)
  return jnp.asarray(pad_prompts([ids], PROMPT_LEN))


def _best(alpha: float, c: float, verify: dict[int, float]) -> tuple[int, float]:
  """The best gamma <= 7 and its speedup: E[tokens] / (gamma c + T_verify(gamma+1)/T_step)."""
  return max(((g, float(theory.expected_tokens_per_iteration(alpha, g))
               / (g * c + verify[g + 1])) for g in range(1, 8)), key=lambda x: x[1])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  path = gguf_file(_TARGET.value)
  checkpoint = gguf_loader.load_gguf(path)
  model = LlamaModel(checkpoint.config)
  weights = model.prepare(checkpoint.params)
  target = LlamaScorer(model, weights)
  inputs = _prompt(checkpoint)
  drafts = {}
  for layers, width, head, eagle in GRIDS[_GRID.value]:
    heads = width // 64
    kv_groups = heads // checkpoint.config.num_kv_heads if eagle else 2 - heads % 2
    student = Student(student_config(checkpoint.config, d_model=width, num_layers=layers,
                                     head_size=head, kv_groups=kv_groups,
                                     reads_features=eagle, tied_io=eagle))
    params = student.init_params(jax.random.PRNGKey(0))
    head_tokens = jnp.arange(head, dtype=jnp.int32)  # The cost depends on the size only.
    drafts[(layers, width, head, eagle)] = (
        student.draft(params, weights.embedding, head_tokens), inputs, None)
  t0 = time.perf_counter()
  with contention.quiet("student_shapes") as guard:
    steps = timing.target_step_times(
        target, inputs, chunk_lengths=range(1, 9), cache_len=CACHE_LEN, position=POSITION,
        calls=CALLS, repeats=_REPETITIONS.value)
    seconds = timing.draft_token_times_rotated(
        drafts, gamma=GAMMA, warp=Warp(), cache_len=CACHE_LEN, position=POSITION,
        calls=CALLS, repetitions=_REPETITIONS.value)
  t_step = steps[1].seconds
  verify = {k: s.seconds / t_step for k, s in steps.items()}
  rows = []
  for (layers, width, head, eagle), t_draft in seconds.items():
    c = t_draft / t_step
    row = {"layers": layers, "d_model": width, "head": head, "tied_io": eagle,
           "reads_features": eagle, "t_draft_ms": t_draft * 1e3, "c": c}
    for alpha in ALPHAS:
      gamma, speedup = _best(alpha, c, verify)
      row[f"alpha_{alpha}"] = {"gamma": gamma, "speedup": round(speedup, 3)}
    rows.append(row)
  output = _OUTPUT.value or os.path.join(
      layout.REPO_ROOT, "results", "smollm2_draft",
      "shapes.json" if _GRID.value == "projected" else f"shapes_{_GRID.value}.json")
  out = {"command": f"python -m benchmarks student_shapes --grid={_GRID.value}",
         "target": os.path.basename(path),
         "environment": timing.environment(), "guard": guard.explain(),
         "t_step_ms": t_step * 1e3, "t_verify_over_t_step": verify,
         "compile_s": {k: s.compile_s for k, s in steps.items()},
         "gamma_timed": GAMMA, "prompt_tokens": PROMPT_LEN, "rows": rows,
         "seconds": round(time.perf_counter() - t0, 1)}
  atomic_io.write_json(output, out)
  print(f"T_step {t_step * 1e3:.2f} ms; T_verify(k)/T_step "
        + ", ".join(f"{k}: {v:.2f}" for k, v in verify.items()))
  print("layers d_model head  ms/token   c     " + "  ".join(f"a={a}: g/speedup" for a in ALPHAS))
  for r in rows:
    print(f"{r['layers']:>6} {r['d_model']:>7} {r['head']:>5} {r['t_draft_ms']:8.3f} "
          f"{r['c']:6.3f}  " + "  ".join(f"{r[f'alpha_{a}']['gamma']}/"
                                         f"{r[f'alpha_{a}']['speedup']:.2f}X" for a in ALPHAS))
  print(json.dumps({"written": output}))
