"""The timing guard: other processes' CPU use is seen, our own jobs are paused, refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from specdec_jax import contention

BUSY_LOOP = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


@pytest.fixture
def busy_process():
  proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
  time.sleep(0.3)
  yield proc
  proc.kill()
  proc.wait()


def _state(pid: int) -> str:
  with open(f"/proc/{pid}/stat") as f:
    stat = f.read()
  return stat[stat.rindex(")") + 2:].split()[0]


def test_busy_process_is_seen_and_refused(busy_process, monkeypatch):
  busy = {p.pid: p.cores for p in contention.busy_processes(window_s=0.5)}
  assert busy.get(busy_process.pid, 0.0) > 0.2  # A busy loop, even on a loaded machine.
  monkeypatch.setenv(contention.GUARD_ENV, "on")
  with (pytest.raises(contention.ContentionError, match=f"pid {busy_process.pid}"),
        contention.quiet("a test timing")):
    pass


def test_refusal_can_be_turned_off_and_is_recorded(busy_process, monkeypatch):
  monkeypatch.setenv(contention.GUARD_ENV, "off")
  with contention.quiet("a test timing") as guard:
    pass
  record = guard.record()
  assert not guard.ok and not record["enforced"]
  assert record["other_cores_before"] > 0.2


def test_jobs_register_in_the_data_dir_unless_told_elsewhere(tmp_path, monkeypatch):
  monkeypatch.delenv(contention.JOBS_DIR_ENV, raising=False)
  monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path))
  assert contention.jobs_dir() == str(tmp_path / "jobs")
  monkeypatch.setenv(contention.JOBS_DIR_ENV, str(tmp_path / "elsewhere"))
  assert contention.jobs_dir() == str(tmp_path / "elsewhere")


def test_registered_job_is_paused_inside_the_guard_and_resumed(busy_process, tmp_path,
                                                               monkeypatch):
  monkeypatch.setenv(contention.JOBS_DIR_ENV, str(tmp_path / "jobs"))
  os.makedirs(contention.jobs_dir())
  with open(os.path.join(contention.jobs_dir(), f"job.{busy_process.pid}.pid"), "w") as f:
    f.write(f"{busy_process.pid}\n")
  assert contention.registered_jobs() == [busy_process.pid]
  with contention.Guard() as guard:
    assert _state(busy_process.pid) == "T"  # Stopped while timing.
  assert _state(busy_process.pid) in ("R", "S")
  assert busy_process.pid in guard.record()["paused_jobs"]
  # Paused, the job was not contention.
  assert busy_process.pid not in [p["pid"] for p in guard.record()["busy_before"]]


def test_stale_job_files_are_dropped(tmp_path, monkeypatch):
  monkeypatch.setenv(contention.JOBS_DIR_ENV, str(tmp_path / "jobs"))
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  os.makedirs(contention.jobs_dir())
  path = os.path.join(contention.jobs_dir(), f"gone.{proc.pid}.pid")
  with open(path, "w") as f:
    f.write(f"{proc.pid}\n")
  assert contention.registered_jobs() == []
  assert not os.path.exists(path)


def test_command_line_check_exits_non_zero_when_busy(busy_process):
  out = subprocess.run([sys.executable, "-m", "specdec_jax.contention"], capture_output=True,
                       text=True, check=False)
  assert out.returncode == 1
  assert f"pid {busy_process.pid}" in out.stderr


def test_guard_resumes_jobs_when_the_block_raises(busy_process, tmp_path, monkeypatch):
  monkeypatch.setenv(contention.JOBS_DIR_ENV, str(tmp_path / "jobs"))
  os.makedirs(contention.jobs_dir())
  with open(os.path.join(contention.jobs_dir(), f"job.{busy_process.pid}.pid"), "w") as f:
    f.write(f"{busy_process.pid}\n")
  with pytest.raises(KeyError), contention.Guard():
    raise KeyError("inside the timing")
  assert _state(busy_process.pid) != "T"
  os.kill(busy_process.pid, signal.SIGCONT)


def test_guard_leaves_a_job_stopped_before_it_stopped(busy_process, tmp_path, monkeypatch):
  monkeypatch.setenv(contention.JOBS_DIR_ENV, str(tmp_path / "jobs"))
  os.makedirs(contention.jobs_dir())
  with open(os.path.join(contention.jobs_dir(), f"job.{busy_process.pid}.pid"), "w") as f:
    f.write(f"{busy_process.pid}\n")
  os.kill(busy_process.pid, signal.SIGSTOP)  # Stopped by hand, e.g. for the test suite.
  time.sleep(0.1)
  with contention.Guard() as guard:
    pass
  assert _state(busy_process.pid) == "T"
  assert busy_process.pid not in guard.record()["paused_jobs"]
  os.kill(busy_process.pid, signal.SIGCONT)


def test_jobs_resume_when_the_timing_process_dies_inside_the_guard(busy_process, tmp_path):
  """A segfault or SIGKILL runs no `finally`: the guard's watcher resumes the job."""
  env = {**os.environ, contention.JOBS_DIR_ENV: str(tmp_path / "jobs")}
  os.makedirs(os.path.join(tmp_path, "jobs"))
  with open(os.path.join(tmp_path, "jobs", f"job.{busy_process.pid}.pid"), "w") as f:
    f.write(f"{busy_process.pid}\n")
  dies = ("import os, signal\nfrom specdec_jax import contention\n"
          "contention.Guard().__enter__()\nprint(open(f'/proc/{pid}/stat').read().split(')')"
          "[-1].split()[0], flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
  out = subprocess.run([sys.executable, "-c", dies.replace("{pid}", str(busy_process.pid))],
                       env=env, capture_output=True, text=True, check=False, timeout=120)
  assert out.returncode == -signal.SIGKILL
  assert out.stdout.strip() == "T"  # Paused inside the guard ...
  deadline = time.time() + 5
  while _state(busy_process.pid) == "T" and time.time() < deadline:
    time.sleep(0.1)
  assert _state(busy_process.pid) in ("R", "S")  # ... and resumed after its death.


def test_attempts_wait_after_a_refusal_and_raise_the_last(monkeypatch):
  waits, said = [], []
  monkeypatch.setattr(contention, "wait_until_quiet", waits.append)
  calls = []
  for attempt in contention.attempts(said.append):
    with attempt:
      calls.append(attempt.number)
      if len(calls) < 2:
        raise contention.ContentionError("busy")
  assert calls == [1, 2] and waits == [contention.QUIET_WAIT_S] and "busy" in said[0]
  with pytest.raises(contention.ContentionError, match="still busy"):
    for attempt in contention.attempts(said.append):
      with attempt:
        raise contention.ContentionError("still busy")
  assert len(waits) == 1 + contention.QUIET_ATTEMPTS - 1
  with pytest.raises(ValueError, match="not a refusal"):
    for attempt in contention.attempts(said.append):
      with attempt:
        raise ValueError("not a refusal")
  assert len(waits) == contention.QUIET_ATTEMPTS  # No wait for another error.
