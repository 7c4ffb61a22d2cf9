"""experiments.measure_alpha: one alpha measurement over any target kind, its file and checks.

Tiny random models of both kinds: a T5 saved as an HF checkpoint, and the GGUF Llama of
`test_targets` (chat prompts, its layer-skip and prompt-lookup drafts)."""

from __future__ import annotations

import json

import gin
import numpy as np
import pytest
from absl import app, flags
from absl.testing import flagsaver

from experiments import measure_alpha
from specdec_jax.experiment import report
from specdec_jax.experiment.targets import t5_target

FIELDS = {"alpha_beta", "alpha_empirical", "tokens_per_call", "tokens", "iterations",
          "examples", "accepted_histogram"}


def _measure(output: str, bindings: list[str], **values) -> dict:
  """Runs the command with these flag values and gin bindings; returns the file it wrote."""
  flags.FLAGS.mark_as_parsed()
  defaults = dict(tasks=["ende"], temperatures=["0", "1"], num_examples=3, batch_size=2)
  try:
    with flagsaver.flagsaver(**{**defaults, **values}, output=output, gin_bindings=bindings):
      measure_alpha.main(["measure_alpha"])
  finally:
    gin.clear_config()
  with open(output, encoding="utf-8") as f:
    return json.load(f)


def _t5(pair_dir: str, gamma: int = 2) -> list[str]:
  return [f"Settings.models_dir = {pair_dir!r}", "Settings.input_len = 16",
          "Settings.max_decode_len = 6", f"Settings.gamma = {gamma}"]


def _check_row(row: dict, examples: int, gamma: int) -> None:
  assert set(row) == FIELDS and row["examples"] == examples
  assert 0 <= row["alpha_beta"] <= 1 and 0 <= row["alpha_empirical"] <= 1
  histogram = row["accepted_histogram"]
  assert len(histogram) == gamma + 1 and sum(histogram) == row["iterations"]
  assert row["tokens_per_call"] == pytest.approx(row["tokens"] / row["iterations"])


def test_a_t5_target_its_rows_details_and_a_second_draft_kept(tmp_path, pair_dir):
  path = str(tmp_path / "alpha.json")
  got = _measure(path, _t5(pair_dir), drafts=["draft"])
  assert list(got["alpha"]) == ["draft"] and set(got["alpha"]["draft"]["ende"]) == {"T=0", "T=1"}
  for row in got["alpha"]["draft"]["ende"].values():
    _check_row(row, 3, gamma=2)  # Batches of 2 and 1: the short one is not padded.
  details = got["_details"]
  assert details["settings"]["target_kind"] == "t5" and details["settings"]["gamma"] == 2
  assert details["examples"] == {"ende": 3} and details["split_examples"]["ende"] > 3
  assert details["prompts"]["ende"].startswith("'translate English to German: '")
  assert details["ngram_fit"] is None and "draft" in details["drafts"]
  # Another draft joins the file; the rows there are kept as they were.
  both = _measure(path, _t5(pair_dir), drafts=["prompt_lookup"], temperatures=["0"])
  assert both["alpha"]["draft"] == got["alpha"]["draft"]
  assert set(both["alpha"]) == {"draft", "prompt_lookup"}
  assert set(both["_details"]["drafts"]) == {"draft", "prompt_lookup"}


def test_the_target_as_its_own_draft_is_always_accepted(tmp_path, pair_dir):
  got = _measure(str(tmp_path / "alpha.json"), _t5(pair_dir), drafts=["target"])
  for row in got["alpha"]["target"]["ende"].values():
    np.testing.assert_allclose([row["alpha_beta"], row["alpha_empirical"]], 1.0, atol=1e-5)


def test_a_file_of_other_settings_is_refused_before_any_work(tmp_path, pair_dir, monkeypatch):
  path = str(tmp_path / "alpha.json")
  _measure(path, _t5(pair_dir), drafts=["draft"], temperatures=["0"])
  monkeypatch.setattr(t5_target, "load_hf_checkpoint", lambda *a, **k: pytest.fail("loaded"))
  with pytest.raises(app.UsageError, match=r"--output=.* other settings \(gamma differ\)"):
    _measure(path, _t5(pair_dir, gamma=3), drafts=["draft"])


def test_a_gguf_llama_target_through_the_same_command(tmp_path):
  from test_targets import write_tiny_gguf  # noqa: PLC0415  (needs the gguf package)

  target = str(tmp_path / "tiny.gguf")
  write_tiny_gguf(target)
  path = str(tmp_path / "llama.json")
  got = _measure(path, ["Settings.target_kind = 'llama_gguf'", f"Settings.target = {target!r}",
                        "Settings.input_len = 64", "Settings.max_decode_len = 6",
                        "Settings.gamma = 1"],
                 drafts=["layer_skip_1", "prompt_lookup"], num_examples=2)
  assert set(got["alpha"]) == {"layer_skip_1", "prompt_lookup"}
  for by_task in got["alpha"].values():
    for row in by_task["ende"].values():
      _check_row(row, 2, gamma=1)
  details = got["_details"]
  assert details["settings"]["target_kind"] == "llama_gguf"
  assert details["prompts"]["ende"].startswith("Translate to German: <source>, in the file's "
                                               "chat template")
  # What analyze prints of a decoder-only target's file: Table 3's rows.
  section = report.decoder_only_section(path)
  assert "| ende | layer_skip_1 |" in section and "| ende | prompt_lookup |" in section


@pytest.mark.parametrize("values, bindings, match", [
    ({}, ["Settings.target_kind = 'llama_gguf'"],
     r"--drafts: name the drafts of the 'llama_gguf' target"),
    ({"drafts": ["layer_skip_1"]}, [], r"'layer_skip_1'.* \(Experiment.drafts / tasks are "
                                       r"--drafts / --tasks here.\)"),
    ({"drafts": ["draft"], "tasks": ["explain"]}, [], r"'explain', a chat model's task"),
])
def test_bad_runs_fail_before_work_naming_the_flag(tmp_path, pair_dir, values, bindings, match):
  with pytest.raises(app.UsageError, match=match):
    _measure(str(tmp_path / "alpha.json"), _t5(pair_dir) + bindings, **values)


@pytest.mark.parametrize("flag, value", [
    ("temperatures", ["0", "hot"]), ("temperatures", ["-1"]), ("temperatures", ["nan"]),
    ("temperatures", []), ("tasks", ["klingon"]), ("drafts", []), ("batch_size", 0),
    ("num_examples", 0),
])
def test_flags_are_checked_when_parsed(flag, value):
  with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError, match=flag):
    setattr(flags.FLAGS, flag, value)


def test_spread_and_batches():
  items = list(range(10))
  assert measure_alpha.spread(items, 4) == [0, 3, 6, 9]
  assert measure_alpha.spread(items, None) == items and measure_alpha.spread(items, 99) == items
  rows = np.arange(10).reshape(5, 2)
  assert [len(b) for b in measure_alpha.batches(rows, 2)] == [2, 2, 1]
