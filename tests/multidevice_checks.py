"""Sharded decoding on 8 simulated CPU devices, run by `test_partitioning.py` in a subprocess.

The device count must be fixed before JAX starts, and the rest of the suite
runs on one device, so these checks live in their own process. Each check
records `{"ok": bool, "detail": str, "seconds": float}` under its name in the
JSON file given as the only argument.

Every sharded run is compared with the same model on one device (no mesh),
token for token. The sharded models carry their axis rules, so their caches
and cross-attention keys/values are constrained where they are created.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time

os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "  # + conftest's flags.
                           "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from conftest import make_model  # noqa: E402

from specdec_jax import partitioning  # noqa: E402
from specdec_jax.decoding import acceptance  # noqa: E402
from specdec_jax.decoding.drafts import PromptLookupDraft  # noqa: E402
from specdec_jax.decoding.sampling import Warp  # noqa: E402
from specdec_jax.decoding.speculative import _speculative_sample  # noqa: E402
from specdec_jax.distillation import teacher  # noqa: E402
from specdec_jax.models.llama import TEST_CONFIG as LLAMA_TEST_CONFIG  # noqa: E402
from specdec_jax.models.llama import LlamaModel, LlamaScorer, pad_prompts  # noqa: E402
from specdec_jax.models.options import DecodeOptions  # noqa: E402
from specdec_jax.models.t5 import (  # noqa: E402
  T5Draft,
  T5Scorer,
  speculative_sample,
  temperature_sample,
)

MESHES = ((8, 1), (2, 4), (1, 8))
BATCH, INPUT_LEN, MAX_LEN, GAMMA = 8, 7, 12, 3
# Heads, MLP units and vocabulary all divide by 8, so every mesh above splits them.
TARGET = dict(num_heads=8, d_kv=4, d_ff=64, vocab_size=96, num_layers=1, num_decoder_layers=1)
# The draft: the target's weights plus this much of another random model's, so
# that some proposals are accepted and some rejected (alpha ~0.5 greedy, ~0.9 sampled).
DRAFT_NOISE = 0.2


def _same(a, b) -> tuple[bool, str]:
  a, b = np.asarray(a), np.asarray(b)
  return bool(np.array_equal(a, b)), f"{a.tolist()} vs {b.tolist()}"


def main(out_path: str) -> None:
  results = {}

  def check(name: str, fn) -> None:
    start = time.perf_counter()
    try:
      ok, detail = fn()
    except Exception as e:  # noqa: BLE001 -- reported to the test, which fails on it.
      ok, detail = False, f"{type(e).__name__}: {e}"
    results[name] = {"ok": ok, "detail": detail, "seconds": time.perf_counter() - start}
    print(name, results[name]["ok"], f"{results[name]['seconds']:.1f}s", flush=True)

  target, target_params = make_model("test-v1_1", 0, **TARGET)
  _, noise = make_model("test-v1_1", 1, **TARGET)
  draft_model = target
  # The same models for 8 devices: sharded by their rules, caches constrained by them,
  # batch and heads apart and XLA's dots (the reference above runs on one device).
  on_mesh = DecodeOptions.for_backend(devices=len(jax.devices()))
  sharded_target = dataclasses.replace(target, axis_rules=partitioning.axis_rules(),
                                       options=on_mesh)
  replicated_draft = dataclasses.replace(target, axis_rules=partitioning.draft_axis_rules(),
                                         options=on_mesh)
  dp_target = dataclasses.replace(target, options=on_mesh)
  draft_params = jax.tree.map(lambda p, n: p + DRAFT_NOISE * n, target_params, noise)
  inputs = np.random.RandomState(0).randint(2, 96, (BATCH, INPUT_LEN)).astype(np.int32)
  rng = jax.random.PRNGKey(3)
  draft = T5Draft(draft_model, draft_params)
  ref = {
      "base_greedy": temperature_sample(target, target_params, inputs, max_decode_len=MAX_LEN),
      "base_sampled": temperature_sample(target, target_params, inputs, max_decode_len=MAX_LEN,
                                         temperature=1.0, rng=rng),
      "spec_greedy": speculative_sample(target, target_params, draft, inputs, gamma=GAMMA,
                                        max_decode_len=MAX_LEN),
      "spec_sampled": speculative_sample(target, target_params, draft, inputs, gamma=GAMMA,
                                         max_decode_len=MAX_LEN, temperature=1.0, rng=rng),
  }

  for data, model in MESHES:
    mesh = partitioning.make_mesh(data, model)
    tag = f"{data}x{model}"
    params = partitioning.shard_params(sharded_target, target_params, mesh)
    sharded_draft = T5Draft(sharded_target,
                            partitioning.shard_params(sharded_target, draft_params, mesh))
    x = partitioning.shard_batch(inputs, mesh)

    def param_bytes(params=params, mesh=mesh):
      per_device = sum(a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(params))
      total = sum(a.nbytes for a in jax.tree.leaves(params))
      expected = partitioning.estimate_memory(target.config, mesh, BATCH, MAX_LEN).params
      ok = per_device == expected and per_device <= 1.1 * total / mesh.shape["model"] + 4096
      return ok, f"per device {per_device}, total {total}, estimate {expected}"

    check(f"param_bytes_{tag}", param_bytes)

    with jax.set_mesh(mesh):
      def spec_greedy(params=params, draft=sharded_draft, x=x, data=data, model=model,
                      draft_heads=TARGET["num_heads"] // model):
        scorer = T5Scorer(sharded_target, sharded_target.prepare(params))
        context = scorer.encode(x)
        compiled = _speculative_sample.lower(
            scorer, context, draft, x, rng, gamma=GAMMA, max_decode_len=MAX_LEN, warp=Warp(),
            eos_id=1, verify=acceptance.verify).compile()
        # Per-device caches: keys [b / data, heads / model, d_kv, max_len + gamma + 1],
        # values [b / data, heads / model, max_len + gamma + 1, d_kv] (a replicated
        # draft's: all its heads). The shapes the cache updates write (other arrays,
        # e.g. a position bias [b, heads, gamma + 1, cache_len], can share the pattern).
        hlo = "\n".join(line for line in compiled.as_text().splitlines()
                        if "dynamic-update-slice" in line or "scatter" in line)
        cache_len = MAX_LEN + GAMMA + 1
        shapes = (set(re.findall(rf"f32\[(\d+),(\d+),4,{cache_len}\]", hlo))
                  | set(re.findall(rf"f32\[(\d+),(\d+),{cache_len},4\]", hlo)))
        want = {(str(BATCH // data), str(TARGET["num_heads"] // model)),
                (str(BATCH // data), str(draft_heads))}
        out = compiled(scorer, context, draft, x, rng)
        ok, detail = _same(out.sequences, ref["spec_greedy"].sequences)
        return ok and shapes == want, f"cache shapes {shapes} (want {want}); {detail}"

      check(f"spec_greedy_{tag}", spec_greedy)
      check(f"base_greedy_{tag}", lambda params=params, x=x: _same(
          temperature_sample(sharded_target, params, x, max_decode_len=MAX_LEN).sequences,
          ref["base_greedy"].sequences))
      if (data, model) == (2, 4):
        # A draft by draft_axis_rules: heads, MLP and vocabulary on every device.
        replicated = T5Draft(replicated_draft, partitioning.shard_params(
            replicated_draft, draft_params, mesh))

        def cache_constraint(mesh=mesh):
          # Caches made from nothing (no input to propagate from) follow their model's rules.
          got = [jax.jit(lambda m=m: m.init_cache(BATCH, MAX_LEN))() for m in (
              sharded_target, replicated_draft)]
          want = [jax.sharding.NamedSharding(mesh, P("data", heads, None, None))
                  for heads in ("model", None)]
          ok = all(c.keys[0].sharding.is_equivalent_to(w, 4)
                   and c.values[0].sharding.is_equivalent_to(w, 4)
                   for c, w in zip(got, want, strict=True))
          return ok, f"keys {[c.keys[0].sharding.spec for c in got]} (want {want})"

        check(f"cache_constraint_{tag}", cache_constraint)
        check(f"spec_greedy_replicated_draft_{tag}",
              lambda params=params, replicated=replicated, spec_greedy=spec_greedy: spec_greedy(
                  params, replicated, draft_heads=TARGET["num_heads"]))
        check(f"base_sampled_{tag}", lambda params=params, x=x: _same(
            temperature_sample(sharded_target, params, x, max_decode_len=MAX_LEN,
                               temperature=1.0, rng=rng).sequences, ref["base_sampled"].sequences))
        check(f"spec_sampled_{tag}", lambda params=params, sharded_draft=sharded_draft, x=x: _same(
            speculative_sample(sharded_target, params, sharded_draft, x, gamma=GAMMA,
                               max_decode_len=MAX_LEN, temperature=1.0, rng=rng).sequences,
            ref["spec_sampled"].sequences))

  # Under shard_map the caches are per-shard: the rules add no constraint there.
  check("dp_spec_greedy", lambda: _same(speculative_sample(
      sharded_target, target_params, T5Draft(sharded_target, draft_params), inputs,
      mesh=partitioning.make_mesh(8, 1), gamma=GAMMA, max_decode_len=MAX_LEN).sequences,
      ref["spec_greedy"].sequences))

  def dp_sampled():
    # Rows split over "data" (2), replicas over "model" (4); shard i samples with
    # fold_in(rng, i): compare with one device, shard by shard.
    mesh = partitioning.make_mesh(2, 4)
    out = temperature_sample(dp_target, target_params, inputs, mesh=mesh,
                             max_decode_len=MAX_LEN, temperature=1.0, rng=rng)
    rows = BATCH // 2
    want = np.concatenate([temperature_sample(
        target, target_params, inputs[i * rows:(i + 1) * rows], max_decode_len=MAX_LEN,
        temperature=1.0, rng=jax.random.fold_in(rng, i)).sequences for i in range(2)])
    return _same(out.sequences, want)

  check("dp_base_sampled", dp_sampled)

  def dp_draft_inputs():
    # The draft reads its own rows, split over "data" like the inputs: prompt lookup
    # in the target's greedy output accepts long runs, in `inputs` hardly any.
    lookup = PromptLookupDraft(TARGET["vocab_size"])
    own = np.asarray(ref["spec_greedy"].sequences)  # [BATCH, MAX_LEN]
    mesh = partitioning.make_mesh(8, 1)
    want = speculative_sample(target, target_params, lookup, inputs, gamma=GAMMA,
                              max_decode_len=MAX_LEN, draft_inputs=own)
    got, without = (speculative_sample(
        dp_target, target_params, lookup, inputs, mesh=mesh, gamma=GAMMA, max_decode_len=MAX_LEN,
        draft_inputs=draft_inputs) for draft_inputs in (own, None))
    ok, detail = _same(got.accepted_mask, want.accepted_mask)
    accepted = (int(np.sum(got.stats.accepted)), int(np.sum(without.stats.accepted)))
    ok = (ok and np.array_equal(got.sequences, ref["spec_greedy"].sequences)
          and accepted[0] > accepted[1])
    return ok, f"accepted with / without draft_inputs {accepted}; masks {detail}"

  check("dp_spec_draft_inputs", dp_draft_inputs)

  def signals_split_rows():
    # The teacher's signals with each call's rows over the 8 devices equal one device's.
    mesh = partitioning.make_mesh(8, 1)
    rng = np.random.RandomState(0)
    t5_inputs = rng.randint(1, TARGET["vocab_size"], size=(8, 12)).astype(np.int32)
    t5_decoder = rng.randint(1, TARGET["vocab_size"], size=(8, 2, 6)).astype(np.int32)
    t5_params = jax.tree.map(lambda x: np.asarray(x, np.float32), target_params)
    details, ok = [], True
    want, got = (teacher._t5_signals_jit(target, 4, m, t5_params, t5_inputs, t5_decoder)
                 for m in (None, mesh))
    for name, a, b in zip(("hidden", "ids", "logprobs", "rest"), want, got, strict=True):
      same = np.allclose(np.asarray(a), np.asarray(b), atol=1e-5)
      ok &= same
      details.append(f"t5 {name} {same}")
    llama = LlamaModel(LLAMA_TEST_CONFIG)
    scorer = LlamaScorer(llama, llama.prepare(llama.init_params(jax.random.PRNGKey(0))))
    prompts = pad_prompts([list(range(3, 3 + n)) for n in (4, 2, 5, 3, 6, 2, 4, 3)])
    decoder = rng.randint(1, LLAMA_TEST_CONFIG.vocab_size, size=(8, 2, 5)).astype(np.int32)
    want, got = (teacher.llama_signals(scorer, prompts, decoder, top_k=4, mesh=m)
                 for m in (None, mesh))
    split = len(got[-1].sharding.device_set) == 8
    ok &= split
    details.append(f"llama split over 8 devices {split}")
    for name, a, b in zip(("prompt_features", "ids", "logprobs", "rest", "features"), want,
                          got, strict=True):
      same = np.allclose(np.asarray(a), np.asarray(b), atol=1e-5)
      ok &= same
      details.append(f"llama {name} {same}")
    return ok, "; ".join(details)

  check("signals_split_rows", signals_split_rows)
  with open(out_path, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
