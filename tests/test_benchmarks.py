"""benchmarks: the one entry point lists every benchmark, refuses an unknown name, and starts
each one (its flags parsed, its imports whole) without measuring anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import __main__ as entry
from specdec_jax.data import layout


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=layout.REPO_ROOT,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_every_benchmark_is_a_module_of_the_package():
  here = os.path.join(layout.REPO_ROOT, "benchmarks")
  modules = {name[:-3] for name in os.listdir(here)
             if name.endswith(".py") and not name.startswith("__")}
  assert modules == set(entry.BENCHMARKS)


def test_no_name_lists_them_and_fails():
  done = _run()
  assert done.returncode != 0
  for name in entry.BENCHMARKS:
    assert f"  {name}" in done.stderr, name


def test_an_unknown_name_is_refused_with_the_list():
  done = _run("decode_step")
  assert done.returncode != 0
  assert "'decode_step' is not a benchmark; use one of" in done.stderr
  assert "panel_dot" in done.stderr


@pytest.mark.parametrize("name", sorted(entry.BENCHMARKS))
def test_each_benchmark_starts_and_shows_its_flags(name):
  done = _run(name, "--helpfull")  # absl prints the flags and exits with status 1.
  assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
  assert f"python -m benchmarks {name}" in done.stdout  # Its docstring: what it does, how.
  assert "--output" in done.stdout
