"""experiments.device_check: its CPU smoke mode end to end, the wrapper, and its imports."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from experiments import device_check
from specdec_jax.data import layout
from specdec_jax.harness import family

# The module-scoped fixtures run once: every test of this file on one worker.
pytestmark = pytest.mark.xdist_group("device_check")

SMOKE = device_check.SMOKE
# What the device machine lacks: importing any of them must not be needed.
ABSENT = ("gin", "seqio", "tensorflow", "torch", "tqdm")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[str, list[dict]]:
  """One smoke run (shipped models, real prompts): its output folder and its rows."""
  out = str(tmp_path_factory.mktemp("device_check"))
  device_check.main(["--output_dir", out, "--smoke"])
  with open(os.path.join(out, device_check.RESULTS_FILE)) as f:
    return out, [json.loads(line) for line in f]


def _section(rows: list[dict], name: str) -> list[dict]:
  return [r for r in rows if r["section"] == name]


def test_sections_in_order_and_nothing_skipped(smoke):
  _, rows = smoke
  names = [r["section"] for r in rows]
  assert names == (["environment"] + ["jax_40101"] * 3 + ["target_step"] * len(SMOKE.batch_sizes)
                   + ["cache_length"] + ["decode"] * len(device_check.plan(SMOKE)))
  elapsed = [r["elapsed_s"] for r in rows]
  assert elapsed == sorted(elapsed) and elapsed[0] >= 0


def test_environment_row(smoke):
  env = _section(smoke[1], "environment")[0]
  for field in ("jax", "jaxlib", "flax", "backend", "device_kind", "devices", "date"):
    assert env[field], field
  assert env["backend"] == "cpu" and env["mode"] == "smoke"
  assert env["guard"].startswith("not applicable")
  assert env["settings"]["drafts"] == list(SMOKE.drafts)
  assert env["prompts_source"].endswith("test.jsonl")


def test_jax_40101_rows(smoke):
  rows = _section(smoke[1], "jax_40101")
  assert {r["write"] for r in rows} == {"token", "draft_key_cache", "draft_value_cache"}
  for r in rows:
    small, large = r["buffer_bytes"]
    assert small < large and r["buffer_lengths"][0] < r["buffer_lengths"][1]
    assert all(s > 0 for s in r["seconds_per_write"])
    assert r["ratio"] == pytest.approx(r["seconds_per_write"][1] / r["seconds_per_write"][0])
    assert r["verdict"] == ("pass" if r["ratio"] < device_check.WRITE_RATIO_LIMIT else "warn")
  token = next(r for r in rows if r["write"] == "token")
  assert token["update_bytes"] == 4 and token["dtype"] == "int32"


def test_target_step_rows(smoke):
  rows = _section(smoke[1], "target_step")
  assert [r["batch_size"] for r in rows] == list(SMOKE.batch_sizes)
  ks = [str(k) for k in range(1, SMOKE.max_k + 1)]
  for r in rows:
    assert list(r["t_verify_s"]) == ks and all(t > 0 for t in r["t_verify_s"].values())
    assert r["verify_ratio"]["1"] == 1.0 and all(v > 0 for v in r["verify_ratio"].values())
    assert r["t_step_s"] == r["t_verify_s"]["1"]


def test_cache_length_row(smoke):
  row = _section(smoke[1], "cache_length")[0]
  step = _section(smoke[1], "target_step")[0]
  assert row["cache_lengths"] == [step["cache_len"], SMOKE.long_cache_len]
  assert row["t_step_s"][0] == step["t_step_s"] and row["t_step_s"][1] > 0
  assert row["kv_cache_bytes"][0] < row["kv_cache_bytes"][1]
  assert row["bytes_ratio"] > 1 and row["verdict"] in ("pass", "warn")


def test_decode_rows(smoke):
  rows = _section(smoke[1], "decode")
  points = {(r["draft"], r["dtype"], r["batch_size"], r["temperature"]) for r in rows}
  assert points == {(p.draft, p.dtype, p.batch_size, p.temperature)
                    for p in device_check.plan(SMOKE)}
  for r in rows:
    for name in ("baseline", "speculative"):
      assert len(r[f"{name}_s"]) == SMOKE.repetitions
      assert r[f"{name}_ms_per_token"] > 0 and r[f"{name}_compile_s"] >= 0
      assert 0 < r[f"{name}_tokens"] <= SMOKE.num_examples * SMOKE.max_decode_len
    assert r["speedup_measured"] == pytest.approx(
        r["baseline_ms_per_token"] / r["speculative_ms_per_token"])
    assert 0 <= r["alpha_beta"] <= 1 and 0 <= r["alpha_empirical"] <= 1
    assert 1 <= r["tokens_per_iteration"] <= SMOKE.gamma + 1
    assert len(r["accepted_histogram"]) == SMOKE.gamma + 1
    assert r["c"] > 0 and r["t_draft_token_s"] > 0 and r["t_target_step_s"] > 0
    assert r["speedup_predicted_thm38"] > 0 and r["speedup_predicted_cost_model"] > 0
    # Each target call emits its accepted proposals and at most one token of its own.
    histogram = r["accepted_histogram"]
    assert sum(histogram) == r["iterations"]
    assert sum(n * count for n, count in enumerate(histogram)) == r["accepted"]
    assert r["accepted"] <= r["speculative_tokens"] <= r["accepted"] + r["iterations"]


def test_greedy_speculative_equals_baseline(smoke):
  greedy = [r for r in _section(smoke[1], "decode") if r["temperature"] == 0]
  assert greedy and all(r["batch_size"] > 1 for r in greedy)  # Rows at their own positions.
  for r in greedy:
    assert r["greedy_identical"] is True and r["greedy_mismatched_rows"] == 0, r
    assert r["greedy_first_difference"] is None
    assert r["speculative_tokens"] == r["baseline_tokens"]
  sampled = [r for r in _section(smoke[1], "decode") if r["temperature"] > 0]
  assert sampled and all(r["greedy_identical"] is None for r in sampled)


def test_tables_written(smoke):
  out, rows = smoke
  with open(os.path.join(out, device_check.TABLES_FILE)) as f:
    text = f.read()
  assert "## Baseline vs speculative" in text and "jax#40101" in text
  assert text.count("| draft_small | float32 |") == len(_section(rows, "decode"))


def test_budget_skips_points():
  assert device_check.fits_budget(10.0, 5.0, 15.0)
  assert not device_check.fits_budget(10.0, 5.1, 15.0)


def test_plan():
  full = device_check.plan(device_check.FULL)
  assert len(full) == len(device_check.DRAFTS) * 2 * 2 * 2 and full[0] == device_check.Point(
      "draft_small", "float32", 1, 0.0)
  assert {(p.batch_size, p.temperature) for p in device_check.plan(SMOKE)} == {(2, 0.0),
                                                                              (1, 1.0)}


def test_settings_checked():
  with pytest.raises(ValueError, match="max_k"):
    dataclasses.replace(SMOKE, max_k=SMOKE.gamma)
  with pytest.raises(ValueError, match="multiple"):
    dataclasses.replace(SMOKE, num_examples=3)
  with pytest.raises(ValueError, match="long_cache_len"):
    dataclasses.replace(SMOKE, long_cache_len=SMOKE.max_decode_len)
  with pytest.raises(ValueError, match="paired"):
    dataclasses.replace(SMOKE, temperatures=(0.0,))


def test_drafts_are_the_shipped_family():
  assert sorted(device_check.DRAFTS) == sorted(family.DRAFTS)
  assert device_check.FULL.drafts == device_check.DRAFTS


def test_wrapper_runs_from_elsewhere_without_gin_seqio_tensorflow_torch(tmp_path):
  """The wrapper finds the repository from any folder; no absent package is imported."""
  (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f"""
      import sys

      class _Absent:
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] in {ABSENT!r}:
            raise ImportError(f"{{name}} is not on the device machine")

      sys.meta_path.insert(0, _Absent())
      """))
  env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHON=sys.executable)
  result = subprocess.run(
      ["bash", os.path.join(layout.REPO_ROOT, "experiments", "device_check.sh"),
       str(tmp_path / "out"), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
      timeout=120)
  assert result.returncode == 0, result.stderr
  assert "--smoke" in result.stdout
  usage = subprocess.run(["bash", os.path.join(layout.REPO_ROOT, "experiments",
                                               "device_check.sh")],
                         capture_output=True, text=True, timeout=30)
  assert usage.returncode == 2 and "usage" in usage.stderr
