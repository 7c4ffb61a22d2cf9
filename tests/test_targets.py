"""Target kinds: the registry, their checks, and the runner on a decoder-only target.

The llama_gguf kind runs on a tiny random-weight Llama written to a GGUF file
here in llama.cpp's layout (`gguf.GGUFWriter`: float32 tensors, `[out, in]`
matrices, query / key rows in RoPE pair order, a byte-level vocabulary and a
chat template), so the whole path (loader, tokenizer, chat prompts, scorer,
runner) is exercised without the SmolLM2 file.
"""

from __future__ import annotations

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_feature_draft import _feature_student

from specdec_jax.costs import tree_choice
from specdec_jax.decoding.drafts import NgramDraft, PromptLookupDraft
from specdec_jax.decoding.proposers import DraftBranches, Merged, PromptLookup
from specdec_jax.experiment import gin_flags, results_io, runner, tree_point
from specdec_jax.experiment.measure import GreedyCheck
from specdec_jax.experiment.targets import interface, llama_target, registry, t5_target
from specdec_jax.models import layers
from specdec_jax.models.llama import (
  TEST_CONFIG,
  LayerSkipDraft,
  LlamaConfig,
  LlamaModel,
  gguf_loader,
)
from specdec_jax.models.llama.feature_branches import FeatureBranches

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

CONFIG = dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=48,
              rope_theta=10000.0, layer_norm_epsilon=2.0**-16)  # Exact in GGUF's float32.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e"]
TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
            "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _pair_order(w: np.ndarray, heads: int) -> np.ndarray:
  """`[heads * head_dim, in]` rows from HuggingFace's half-split order to llama.cpp's pairs
  (the inverse of what `gguf_loader` undoes)."""
  head_dim = w.shape[0] // heads
  return w.reshape(heads, 2, head_dim // 2, -1).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: str, seed: int = 0) -> tuple[LlamaConfig, dict]:
  """A 2-layer random Llama over a byte-level vocabulary, as a GGUF file; its config, params."""
  tokens = SPECIAL + sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he"]
  config = LlamaConfig(vocab_size=len(tokens), bos_token_id=1, eos_token_id=2, **CONFIG)
  rng = np.random.default_rng(seed)
  # Norm scales 1, the embedding N(0, 1), kernels N(0, 4 / fan_in) (greedy paths visit many
  # tokens); numpy, so nothing compiles.
  init = lambda info: (np.ones(info.shape) if len(info.shape) == 1 else rng.normal(
      0.0, 1.0 if info.axes[0] == "vocab" else 2.0 * info.shape[0] ** -0.5,
      info.shape)).astype(np.float32)
  params = jax.tree.map(init, LlamaModel(config).param_info(),
                        is_leaf=lambda x: isinstance(x, layers.ParamInfo))
  writer = gguf.GGUFWriter(path, "llama")
  writer.add_block_count(config.num_layers)
  writer.add_embedding_length(config.d_model)
  writer.add_feed_forward_length(config.d_ff)
  writer.add_head_count(config.num_heads)
  writer.add_head_count_kv(config.num_kv_heads)
  writer.add_rope_dimension_count(config.head_dim)
  writer.add_rope_freq_base(config.rope_theta)
  writer.add_layer_norm_rms_eps(config.layer_norm_epsilon)
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("gpt2")
  writer.add_token_list(tokens)
  writer.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
  writer.add_token_merges(MERGES)
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_chat_template(TEMPLATE)
  writer.add_tensor("token_embd.weight", params["token_embedder"]["embedding"])
  writer.add_tensor("output_norm.weight", params["decoder"]["decoder_norm"]["scale"])
  for i in range(config.num_layers):
    layer = params["decoder"][f"layers_{i}"]
    for name, (path_, transposed) in gguf_loader._LAYER_TENSORS.items():
      w = layer
      for key in path_:
        w = w[key]
      w = w.T if transposed else w
      if name in ("attn_q", "attn_k"):
        w = _pair_order(w, config.num_heads if name == "attn_q" else config.num_kv_heads)
      writer.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(w, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return config, params


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[str, LlamaConfig, dict]:
  path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
  config, params = write_tiny_gguf(path)
  return path, config, params


def test_loader_reads_back_a_file_in_llama_cpps_layout(tiny_gguf):
  path, config, params = tiny_gguf
  checkpoint = gguf_loader.load_gguf(path)
  assert checkpoint.config == config
  jax.tree.map(np.testing.assert_array_equal, checkpoint.params, params)
  vocabulary = checkpoint.vocabulary
  text = vocabulary.chat_prompt([{"role": "user", "content": "Translate to German: the"}])
  ids = vocabulary.tokenizer().encode(text).ids
  # Control tokens whole (two turns opened, one closed), the merges applied.
  assert ids[0] == 1 and (ids.count(1), ids.count(2)) == (2, 1)
  assert vocabulary.tokens.index("Ġt") in ids
  assert vocabulary.tokenizer().decode(ids, skip_special_tokens=False) == text


def test_registry_names_each_kind_and_its_drafts():
  assert set(registry.TARGET_KINDS) == {"t5", "llama_gguf"}
  with pytest.raises(ValueError, match=r"Settings\.target_kind='gpt' is not a target kind; "
                                       r"use one of \['llama_gguf', 't5'\]"):
    registry.target_kind("gpt")
  t5, llama = registry.TARGET_KINDS["t5"], registry.TARGET_KINDS["llama_gguf"]
  assert t5.draft_kind("bigram") is t5_target.NGRAM
  assert t5.draft_kind("prompt_lookup") is interface.PROMPT_LOOKUP
  assert t5.draft_kind("assets/models/draft_small") is t5_target.CHECKPOINT
  assert llama.draft_kind("layer_skip_12") is llama_target.LAYER_SKIP
  assert llama.draft_kind("bigram") is llama_target.NGRAM
  assert llama.draft_kind("draft_smollm2") is llama_target.STUDENT
  with pytest.raises(ValueError, match=r"'t5_small', which no draft of a 'llama_gguf' target "
                                       r"is: use one of: prompt_lookup; layer_skip_<L>"):
    llama.draft_kind("t5_small")
  assert interface.draft_key(t5_target.NGRAM, "bigram", "ende") == ("bigram", "ende")
  assert interface.draft_key(llama_target.NGRAM, "bigram", "ende") == ("bigram", "")


def _gin(tmp_path, gguf_path: str, **overrides) -> str:
  bindings = {
      "name": "'tiny_llama'", "target_kind": "'llama_gguf'", "target": repr(gguf_path),
      "drafts": "['layer_skip_1']", "tasks": "['ende']", "num_examples": "2",
      "temperatures": "[0.0]", "gammas": "[1]", "max_decode_len": "6", "input_len": "64",
      "repetitions": "1", "timing_calls": "2", "timing_repeats": "1", "timing_rounds": "1",
      "auto_calibration_examples": "2", **overrides}
  path = tmp_path / "tiny_llama.gin"
  path.write_text("".join(f"Experiment.{k} = {v}\n" for k, v in bindings.items()))
  return str(path)


@pytest.mark.parametrize("binding, error, match", [
    ("Experiment.drafts = ['t5_small']", ValueError,
     r"'t5_small', which no draft of a 'llama_gguf' target is"),
    ("Experiment.drafts = ['draft_small']", ValueError,
     r"'draft_small', but .*draft_small is not a decoder-only draft \(.*format None"),
    ("Experiment.drafts = ['draft_none']", FileNotFoundError,
     r"'draft_none', but .*config\.json is missing: train and export a draft there"),
    ("Experiment.drafts = ['layer_skip_3']", ValueError,
     r"'layer_skip_3': L must lie in 1\.\.2, the target's layers"),
    ("Experiment.target = '/no/such.gguf'", FileNotFoundError, r"no GGUF file at '/no/such\.gguf'"),
    ("Experiment.target_kind = 'gpt'", ValueError, r"Experiment\.target_kind='gpt'"),
    ("Experiment.stand_ins_when_missing = True", ValueError,
     r"a 'llama_gguf' target has no random-init stand-ins"),
    ("NgramFit.examples = 0", ValueError, r"NgramFit\.examples must be an int >= 1"),
    ("NgramFit.split = 'dev'", ValueError, r"NgramFit\.split='dev'; use one of"),
    ("NgramFit.split = 'train'", FileNotFoundError,
     r"'bigram', fit on the target's outputs for NgramFit\.split='train' prompts, but .* is "
     r"missing: prepare the corpora"),
])
def test_bad_llama_runs_fail_before_work(tmp_path, tiny_gguf, monkeypatch, binding, error,
                                         match):
  monkeypatch.setattr(llama_target.gguf_loader, "load_gguf", lambda *a: pytest.fail("loaded"))
  monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path))  # No prepared corpora.
  with pytest.raises(error, match=match):
    gin_flags.load_experiment([_gin(tmp_path, tiny_gguf[0], drafts="['layer_skip_1', 'bigram']")],
                           [binding])


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_runner_measures_a_decoder_only_target(tmp_path, tiny_gguf, shared_prefix):
  """The runner, unchanged, on the tiny GGUF Llama: chat prompts, a layer-skip draft,
  greedy tokens checked equal to the baseline's, the row's costs through `Scorer.score`;
  with the chat template's system turn prefilled once or per prompt."""
  exp = gin_flags.load_experiment([_gin(tmp_path, tiny_gguf[0])],
                               [f"PromptCache.shared_prefix = {shared_prefix}"])
  path = runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
                    placement=gin_flags.placement())
  (row,) = results_io.read_points(path)
  assert row.draft == "layer_skip_1" and row.target == tiny_gguf[0]
  assert row.greedy_identical is True and row.speedup_measured > 0
  assert set(row.t_verify_s) == {1, 2} and row.c > 0
  terms = row.cost_model_terms  # The prefill is the target's once-per-sequence work.
  assert terms.encode_target_s > 0 and terms.encode_draft_s > 0
  assert row.example.pieces and len(row.example.pieces) == len(row.example.tokens)


def test_runner_measures_a_tree_beside_the_chain(tmp_path, tiny_gguf):
  """`Experiment.tree` on the tiny GGUF Llama: after the chain point, the layer-skip
  draft's top-2 branches of depth 2 on the same examples, greedy tokens checked equal to
  the baseline's, into trees.jsonl; the table puts the chain beside the tree, and a rerun
  measures nothing again."""
  exp = gin_flags.load_experiment([_gin(tmp_path, tiny_gguf[0], gammas="[4]",
                                        tree="'2x2'")], [])
  path = runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
                    placement=gin_flags.placement())
  (chain,) = results_io.read_points(path)
  (row,) = [tree_point.TreeRow.from_json(r) for r in results_io.read_rows(
      str(tmp_path / "out" / tree_point.TREES_FILE))]
  assert row.shape == "2x2" and row.parents == [-1, 0, 0, 1, 2]
  assert row.greedy_identical is True and row.draft == chain.draft == "layer_skip_1"
  assert row.chain_gamma == 4 and row.chain_speedup == chain.speedup_measured
  assert row.chain_tokens_per_call == chain.tokens_per_iteration
  assert row.tokens_per_call >= 1 and sum(row.accepted_histogram) > 0
  assert np.asarray(row.rank_rates).shape == (2, 2)
  assert min(row.speedup_measured, row.speedup_predicted,
             row.speedup_predicted_steps_only) > 0
  table = tree_point.tree_table([row])
  assert (f"| ende | layer_skip_1 | 0 | 4 | {chain.tokens_per_iteration:.2f} | "
          f"{chain.speedup_measured:.2f}X | 2x2 | {row.tokens_per_call:.2f} | "
          f"**{row.speedup_measured:.2f}X** |") in table
  assert runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
                    placement=gin_flags.placement()) == path
  assert len(results_io.read_rows(str(tmp_path / "out" / tree_point.TREES_FILE))) == 1


@pytest.mark.parametrize("shape, parents", [("2x1+lookup2", [-1, 0, 0, 0, 3]),
                                            ("lookup2+2x1", [-1, 0, 1, 0, 0])])
def test_a_tree_with_the_prompts_continuation_beside_the_drafts_branches(tmp_path, tiny_gguf,
                                                                         shape, parents):
  """`Experiment.tree = '2x1+lookup2'`: the draft's top-2 tokens, then the prompt look-up's
  chain of 2 as the root's third child, in one tree ('lookup2+2x1': the chain first);
  greedy tokens are the baseline's, and the rates cover the look-up's rank."""
  exp = gin_flags.load_experiment([_gin(tmp_path, tiny_gguf[0], gammas="[4]",
                                        tree=f"{shape!r}")], [])
  runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(), placement=gin_flags.placement())
  (row,) = [tree_point.TreeRow.from_json(r) for r in results_io.read_rows(
      str(tmp_path / "out" / tree_point.TREES_FILE))]
  assert row.shape == shape and row.parents == parents
  assert row.greedy_identical is True and row.tokens_per_call >= 1
  assert np.asarray(row.rank_rates).shape == (2, 3)
  assert min(row.speedup_measured, row.speedup_predicted,
             row.speedup_predicted_steps_only) > 0
  asked = []

  def branches_of(k, depth):  # Stands in for the kind's tree_proposer of the draft.
    asked.append((k, depth))
    return PromptLookup(depth=9)

  assert tree_point.shaped_proposer(branches_of, "2x1+lookup2") == Merged(
      (PromptLookup(depth=9), PromptLookup(depth=2)))
  assert tree_point.shaped_proposer(branches_of, "lookup3+2x1") == Merged(
      (PromptLookup(depth=3), PromptLookup(depth=9)))
  assert tree_point.shaped_proposer(branches_of, "3x2") == PromptLookup(depth=9)
  assert asked == [(2, 1), (2, 1), (3, 2)]


def test_the_llama_kind_branches_each_model_draft_its_own_way():
  """A feature-reading draft expands the tree reading its own predicted features, a
  layer-skip draft with its scorer; a table look-up has no top-k and is refused."""
  model = LlamaModel(TEST_CONFIG)
  params = model.init_params(jax.random.PRNGKey(0))
  head = jnp.asarray([1, 2, 3], jnp.int32)
  student, sparams = _feature_student(model.config, head)
  feature = llama_target.tree_proposer(
      student.draft(sparams, params["token_embedder"]["embedding"], head), 2, 3)
  assert isinstance(feature, FeatureBranches) and feature.reads_target_features
  skip = llama_target.tree_proposer(LayerSkipDraft(model, model.prepare(params), 1), 3, 1)
  assert isinstance(skip, DraftBranches) and (skip.k, skip.depth) == (3, 1)
  with pytest.raises(ValueError, match="a PromptLookupDraft has no top-k to branch on"):
    llama_target.tree_proposer(PromptLookupDraft(model.config.vocab_size), 2, 2)


@pytest.mark.parametrize("helps", [True, False])
def test_a_tree_chosen_by_the_cost_model(tmp_path, tiny_gguf, monkeypatch, helps):
  """`Experiment.tree = 'auto'`: the shape of highest predicted speedup among k x depth
  within the run's budget, from acceptance measured on held-out examples and the chain's
  costs, measured beside the chain; where none is predicted to pay (forced here either
  way), the row records the target alone and says why."""
  monkeypatch.setattr(tree_choice.TreeChoice, "helps", property(lambda self: helps))
  exp = gin_flags.load_experiment([_gin(tmp_path, tiny_gguf[0], gammas="[2]", tree="'auto'",
                                        auto_calibration_examples="1")], [])
  runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
             placement=gin_flags.placement())
  (row,) = [tree_point.TreeRow.from_json(r) for r in results_io.read_rows(
      str(tmp_path / "out" / tree_point.TREES_FILE))]
  choice = row.shape_choice
  assert row.shape_auto and set(choice["speedups"]) == {"1x1", "1x2", "2x1"}  # Budget 2.
  assert np.asarray(choice["rates"]).shape == (2, tree_point.AUTO_MAX_BRANCHES)
  if helps:
    assert row.shape == choice["name"] and row.greedy_identical is True
    assert row.speedup_measured > 0 and row.speedup_predicted > 0  # On its own rates.
  else:
    assert row.shape == tree_point.TARGET_ALONE and row.speedup_measured == 1.0
    assert "decode with the target alone" in choice["reason"]
  assert f"| {row.shape} (auto) |" in tree_point.tree_table([row])


def test_llama_target_builds_its_drafts_and_prompts(tmp_path, tiny_gguf, monkeypatch):
  """Chat prompts of the examples, and the n-gram drafts fit on the target's own outputs."""
  data = tmp_path / "data"
  for task, source in (("ende", "The file is saved."), ("mansum", "cp copies files.")):
    (data / "corpora" / task).mkdir(parents=True)
    (data / "corpora" / task / "validation.jsonl").write_text(
        json.dumps({"id": "0", "inputs": source, "targets": "-"}) + "\n")
  monkeypatch.setenv("SPECDEC_DATA_DIR", str(data))
  gin_flags.parse_gin([_gin(tmp_path, tiny_gguf[0])], ["NgramFit.batch_size = 2"])
  try:
    exp = gin_flags.build_experiment()
    loaded = llama_target.load(exp, gin_flags.placement())
    inputs = loaded.tokenize("ende", ["translate English to German: the house"], 64)
    text = loaded.vocabulary.tokenizer().decode(inputs[0][inputs[0] != 0].tolist(),
                                                skip_special_tokens=False)
    assert text.endswith("user\nTranslate to German: the house<|im_end|>\n"
                         "<|im_start|>assistant\n")
    kind = registry.TARGET_KINDS["llama_gguf"]
    assert isinstance(kind.draft_kind("layer_skip_2").build(loaded, "layer_skip_2", ""),
                      LayerSkipDraft)
    assert isinstance(kind.draft_kind("prompt_lookup").build(loaded, "prompt_lookup", ""),
                      PromptLookupDraft)
    bigram = kind.draft_kind("bigram").build(loaded, "bigram", "")
    assert isinstance(bigram, NgramDraft) and bigram.order == 2
    assert bigram.vocab_size == loaded.scorer.vocab_size
    assert kind.draft_kind("unigram").build(loaded, "unigram", "").order == 1
  finally:
    gin.clear_config()
