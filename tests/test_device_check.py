"""experiments.device_check: its CPU smoke configuration end to end, its checks of a bad
configuration, the wrapper, and what it imports (the device machine has no TensorFlow,
seqio or torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import gin
import pytest

from experiments import accelerator_checks, device_check
from specdec_jax.data import layout
from specdec_jax.experiment import gin_flags, results_io, settings
from specdec_jax.experiment.targets import family

# The module-scoped fixtures run once: every test of this file on one worker.
pytestmark = pytest.mark.xdist_group("device_check")

SMOKE_GIN = os.path.join("gin_configs", "device_check_smoke.gin")
# What the device machine lacks: importing any of them must not be needed.
ABSENT = ("seqio", "tensorflow", "torch", "transformers")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[str, device_check.DeviceCheck, settings.Experiment]:
  """One smoke run (the shipped target and draft_small, real prompts): its folder, and the
  settings it ran with."""
  out = str(tmp_path_factory.mktemp("device_check"))
  device_check.main(["--output_dir", out, "--gin_file", SMOKE_GIN])
  try:
    gin_flags.parse_gin([SMOKE_GIN], [])
    check = device_check.DeviceCheck()
    (exp,) = device_check.experiments(check)
  finally:
    gin.clear_config()
  return out, check, exp


def _checks(out: str) -> dict:
  with open(os.path.join(out, device_check.CHECKS_FILE), encoding="utf-8") as f:
    return json.load(f)


def test_environment_and_the_jax_40101_writes(smoke):
  out, check, _ = smoke
  checks = _checks(out)
  env = checks["environment"]
  for field in ("jax", "jaxlib", "flax", "backend", "device_kind", "devices", "date", "command"):
    assert env[field], field
  assert env["backend"] == "cpu" and SMOKE_GIN in env["command"]
  writes = checks["jax_40101"]
  assert [w["write"] for w in writes] == ["token", "draft_key_cache", "draft_value_cache"]
  for w in writes:
    assert w["buffer_lengths"] == [max(b // w["update_bytes"], 2) for b in check.write_bytes]
    assert all(s > 0 for s in w["seconds_per_write"])
    assert w["ratio"] == pytest.approx(w["seconds_per_write"][1] / w["seconds_per_write"][0])
    assert w["verdict"] == ("pass" if w["ratio"] < accelerator_checks.WRITE_RATIO_LIMIT else "warn")
  token = writes[0]
  assert token["update_bytes"] == 4 and token["dtype"] == "int32"


def test_the_cache_length_check(smoke):
  out, check, exp = smoke
  cache = _checks(out)["cache_length"]
  assert cache["run"] == exp.name and cache["batch_size"] == exp.batch_sizes[0]
  assert cache["cache_lengths"] == [exp.max_decode_len + check.max_k, check.long_cache_len]
  assert all(t > 0 for t in cache["t_step_s"])
  assert cache["state_bytes"][0] < cache["state_bytes"][1] and cache["bytes_ratio"] > 1
  assert cache["verdict"] in ("pass", "warn")


def test_each_run_is_the_runners_rows_with_the_step_costs_to_max_k(smoke):
  out, check, exp = smoke
  rows = results_io.read_points(os.path.join(out, exp.name, results_io.RESULTS_FILE))
  assert sorted(r.key for r in rows) == sorted(p.key for p in settings.plan(exp))
  for r in rows:
    assert r.experiment == exp.name and r.draft == "draft_small" and r.batch_size == 2
    assert sorted(r.t_verify_s) == list(range(1, check.max_k + 1))
    assert r.verify_ratio[1] == pytest.approx(1.0)
    assert r.speedup_measured > 0 and 0 <= r.alpha_beta <= 1 and r.c > 0
    assert len(r.accepted_histogram) == r.gamma + 1
    assert r.idle_check["enforced"] is False  # The guard is recorded, not enforced.
  # At T = 0 the tokens are the baseline's, checked (the CPU: GreedyCheck.enforce).
  assert [r.greedy_identical for r in sorted(rows, key=lambda r: r.temperature)] == [True, None]


def test_tables_sum_up_every_section(smoke):
  out, _, exp = smoke
  with open(os.path.join(out, device_check.TABLES_FILE), encoding="utf-8") as f:
    text = f.read()
  for heading in ("## jax#40101", "## The target: T_step and T_verify(k) / T_step",
                  f"## {exp.name}: baseline vs speculative"):
    assert heading in text, heading
  assert "Cache length" in text and text.count("| ende | draft_small |") == 2
  assert "Greedy tokens equal to the baseline's at 1 of 1 greedy points." in text
  assert "not measured" not in text and "Failed" not in text


def test_a_run_cut_short_by_the_budget_says_so():
  row = device_check.Report(environment={"device_kind": "cpu", "backend": "cpu", "jax": "0",
                                         "jaxlib": "0", "date": "d", "command": "c"},
                            runs={"device_x": []}, planned={"device_x": 4},
                            failed={"device_x": "RuntimeError: no"})
  text = device_check.tables(row)
  assert "4 of 4 points not measured (time budget or a failure)" in text
  assert "Failed: RuntimeError: no" in text


@pytest.mark.parametrize("binding, match", [
    ("DeviceCheck.runs = []", r"DeviceCheck\.runs is empty"),
    ("DeviceCheck.runs = [{'drafts': ['draft_small']}]", r"each run needs a 'name'"),
    ("DeviceCheck.runs = [{'name': 'a', 'drafts': ['draft_small'], 'gama': 3}]",
     r"\['gama'\] are not"),
    ("DeviceCheck.max_k = 2", r"DeviceCheck\.max_k=2: the run 'device_smoke' needs"),
    ("Experiment.models_dir = '/no/models'", r"Experiment\.target: no checkpoint at"),
])
def test_a_bad_configuration_stops_before_any_work(tmp_path, monkeypatch, binding, match):
  monkeypatch.setattr(device_check, "measure", lambda *a: pytest.fail("measured"))
  with pytest.raises(SystemExit, match=match):
    device_check.main(["--output_dir", str(tmp_path), "--gin_file", SMOKE_GIN,
                       f"--gin.{binding.replace(' = ', '=')}"])
  gin.clear_config()


def test_the_full_check_measures_every_shipped_draft_in_both_dtypes():
  try:
    gin_flags.parse_gin([device_check.DEFAULT_GIN], [])
    exps = device_check.experiments(device_check.DeviceCheck())
  finally:
    gin.clear_config()
  for dtype in ("float32", "bfloat16"):
    drafts = [d for exp in exps if exp.dtype == dtype for d in exp.drafts]
    assert sorted(drafts) == sorted(family.DRAFTS), dtype
  assert exps[0].drafts[0] == "draft_small" and exps[0].dtype == "float32"
  assert all(list(exp.batch_sizes) == [1, 8] for exp in exps)


def test_the_wrapper_puts_the_repository_and_the_wheels_on_the_path(tmp_path):
  """From any folder: the repository and each wheel of WHEELS on PYTHONPATH, run from the
  repository, OUT_DIR made absolute."""
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  (wheels / "gin_config-0-py3-none-any.whl").write_bytes(b"")
  python = tmp_path / "python"
  python.write_text('#!/bin/sh\necho "PATH=$PYTHONPATH"; echo "CWD=$(pwd)"; echo "ARGS=$*"\n')
  python.chmod(0o755)
  script = os.path.join(layout.REPO_ROOT, "experiments", "device_check.sh")
  done = subprocess.run(["bash", script, "out", "--regime_map"], cwd=tmp_path,
                        env=dict(os.environ, PYTHON=str(python), WHEELS=str(wheels),
                                 PYTHONPATH=""),
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
  assert lines["PATH"] == f"{layout.REPO_ROOT}:{wheels / 'gin_config-0-py3-none-any.whl'}"
  assert lines["CWD"] == layout.REPO_ROOT
  assert lines["ARGS"] == (f"-m experiments.device_check --output_dir={tmp_path / 'out'} "
                           "--regime_map")
  usage = subprocess.run(["bash", script], capture_output=True, text=True, timeout=30)
  assert usage.returncode == 2 and "usage" in usage.stderr


def test_it_imports_no_tensorflow_seqio_or_torch(tmp_path):
  (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f"""
      import sys

      class _Absent:
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] in {ABSENT!r}:
            raise ImportError(f"{{name}} is not on the device machine")

      sys.meta_path.insert(0, _Absent())
      """))
  done = subprocess.run([sys.executable, "-m", "experiments.device_check", "--help"],
                        cwd=layout.REPO_ROOT, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=f"{tmp_path}:{layout.REPO_ROOT}"))
  assert done.returncode == 0, done.stderr
  assert "--regime_map" in done.stdout and "--gin_file" in done.stdout
