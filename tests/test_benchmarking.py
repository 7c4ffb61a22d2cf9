"""What every measured row records about where it ran."""

from __future__ import annotations

import os
import re
import subprocess

from specdec_jax import benchmarking

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_environment_names_the_code_it_measured():
  env = benchmarking.environment()
  assert env["backend"] and env["cpu_count"] >= 1
  with open("/proc/cpuinfo") as f:
    avx512 = " avx512f " in f.read().replace("\n", " ")
  assert (env["cpu_vectors"] == "avx512f") == avx512
  head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                        capture_output=True, text=True).stdout.strip()
  if not head:  # Not a git checkout (an installed copy): nothing to name.
    assert "git_commit" not in env
    return
  assert re.fullmatch(r"[0-9a-f]{12}(\+changes)?", env["git_commit"])
  assert env["git_commit"].startswith(head)
