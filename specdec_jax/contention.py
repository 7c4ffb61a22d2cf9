"""Timing on a quiet machine: other processes' CPU use, a calibration kernel, our own jobs paused.

On a 2-core CPU a busy process on the second core leaves a one-token decoder
step unchanged but slows every multi-threaded kernel, so a speedup timed beside
one is wrong, not noisy. Every timing command therefore runs inside a `Guard`:

  with contention.Guard() as guard:
    ...time things...
  row["idle_check"] = guard.record()   # guard.ok says whether to trust it

Entering it pauses (SIGSTOP) our own long jobs registered with `register_job`
(distillation data, training), checks that no other process uses the CPU
(`/proc`, over a short window) and times a calibration kernel; leaving it times
the kernel again, checks `/proc` again and resumes the jobs it paused (SIGCONT),
whatever happened in between, even the timing process's death (a watcher outlives it;
a job stopped before it came stays stopped). The
check is `ok` when other processes used less than `max_other_cores` both times
and the two calibrations agree within `max_drift`: a factor of 2 by default,
because this VM's own speed moves with its recent load even when nothing else
runs (the kernel: 11.0 ms fresh, 18.5 ms after 40 s of full load, 11.8 ms 10 s
later), so the calibration catches gross changes and `/proc` catches other
processes. Timings that matter are interleaved ratios, which such drift hits on
both sides alike. Timings whose check is not ok are refused (`experiments.run`
retries the point once the machine is quiet, then stops and names the process).

`python -m specdec_jax.contention` prints what runs now and exits non-zero if the
machine is busy (check before a long measurement).
`SPECDEC_TIMING_GUARD=off` turns the refusal off (the test suite, whose own
workers keep the CPU busy): the check is still made and recorded, with
`"enforced": false`, so such rows can never pass for quiet ones. No TensorFlow.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax import atomic_io
from specdec_jax.data import layout

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GUARD_ENV = "SPECDEC_TIMING_GUARD"
JOBS_DIR_ENV = "SPECDEC_JOBS_DIR"


def enforced() -> bool:
  """Whether timings under contention are refused (unless `SPECDEC_TIMING_GUARD=off`)."""
  return os.environ.get(GUARD_ENV, "on") != "off"


class ContentionError(RuntimeError):
  """Timing was refused: another process used the CPU (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Process:
  """A process and the CPU it used over a sampling window."""

  pid: int
  command: str
  cores: float


def jobs_dir() -> str:
  """Where our long background jobs register their pids: `$SPECDEC_JOBS_DIR`, else
  `<data_dir>/jobs`."""
  return os.environ.get(JOBS_DIR_ENV) or os.path.join(layout.default_data_dir(), "jobs")


def register_job(name: str) -> None:
  """Registers this process as a long job that timing commands pause around timing.

  Writes `<data_dir>/jobs/<name>.<pid>.pid`; removed at exit.
  """
  os.makedirs(jobs_dir(), exist_ok=True)
  path = os.path.join(jobs_dir(), f"{name}.{os.getpid()}.pid")
  atomic_io.atomic_write_text(path, f"{os.getpid()}\n")
  atexit.register(lambda: os.path.exists(path) and os.remove(path))


def registered_jobs() -> list[int]:
  """Pids of the registered jobs that are alive (stale pid files are removed)."""
  pids = []
  for path in sorted(glob.glob(os.path.join(jobs_dir(), "*.pid"))):
    try:
      with open(path) as f:
        pid = int(f.read().strip())
      os.kill(pid, 0)
    except (ValueError, ProcessLookupError, PermissionError, OSError):
      os.remove(path)
      continue
    pids.append(pid)
  return pids


def _cpu_ticks() -> dict[int, tuple[int, str, str]]:
  """pid -> (utime + stime ticks, state, command) of every process."""
  out = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        stat = f.read()
    except OSError:
      continue
    command = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    out[int(entry)] = (int(fields[11]) + int(fields[12]), fields[0], command)
  return out


def _own_tree() -> set[int]:
  """This process and its ancestors (a shell running us is not contention)."""
  pids, pid = set(), os.getpid()
  while pid > 1:
    pids.add(pid)
    try:
      with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
      pid = int(stat[stat.rindex(")") + 2:].split()[1])
    except (OSError, ValueError):
      break
  return pids


def busy_processes(window_s: float = 0.5, min_cores: float = 0.02) -> list[Process]:
  """Other processes that used at least `min_cores` CPU over `window_s`, busiest first."""
  before = _cpu_ticks()
  time.sleep(window_s)
  after = _cpu_ticks()
  mine = _own_tree()
  busy = []
  for pid, (ticks, _, command) in after.items():
    if pid in mine or pid not in before:
      continue
    cores = (ticks - before[pid][0]) / _CLOCK_TICKS / window_s
    if cores >= min_cores:
      busy.append(Process(pid, command, round(cores, 3)))
  return sorted(busy, key=lambda p: -p.cores)


@functools.partial(jax.jit, static_argnames="rows")
def _calibration_kernel(weights: jax.Array, rows: int) -> jax.Array:
  """Multi-row dots over 16 MB of weights: both cores, memory and FLOPs."""

  def body(_, x):
    for w in weights:
      x = jnp.tanh(jnp.dot(x, w))
    return x

  return jax.lax.fori_loop(0, 4, body, jnp.ones((rows, weights.shape[-1]), jnp.float32))


def calibrate(repeats: int = 9, warmup: int = 3) -> float:
  """Fastest milliseconds of a fixed multi-threaded kernel over `repeats` runs.

  The minimum, after `warmup` untimed runs (compilation, first-touch pages,
  clock ramp-up made the first runs of a fresh process 20-35% slower): another
  busy process slows every run, so it raises the minimum too, while one-off
  hiccups do not.
  """
  weights = _calibration_weights()
  for _ in range(warmup):
    jax.block_until_ready(_calibration_kernel(weights, 8))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(_calibration_kernel(weights, 8))
    times.append(time.perf_counter() - start)
  return 1e3 * min(times)


@functools.cache
def _calibration_weights() -> jax.Array:
  return jax.random.normal(jax.random.PRNGKey(0), (16, 512, 512), jnp.float32) * 0.04


def _stopped(pid: int) -> bool:
  """Whether `pid` is stopped already (state T), e.g. by hand or by another guard."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      stat = f.read()
  except OSError:
    return False
  return stat[stat.rindex(")") + 2:].split()[0] == "T"


def _resume_if_we_die(pids: list[int]) -> subprocess.Popen | None:
  """A watcher that resumes `pids` (SIGCONT) if this process dies first, or None (no pids).

  A timing command that crashes outside Python (a segfault, SIGKILL) runs no `finally`,
  and would leave the jobs it paused stopped for good. The watcher is a shell in its own
  session (a Ctrl-C to the command's group does not reach it) that checks once a second
  whether this process is alive; the guard kills it after resuming the jobs itself.
  """
  if not pids:
    return None
  script = (f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
            f"kill -CONT {' '.join(map(str, pids))} 2>/dev/null")
  return subprocess.Popen(["sh", "-c", script], start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _signal(pids: list[int], sig: signal.Signals) -> list[int]:
  done = []
  for pid in pids:
    try:
      os.kill(pid, sig)
      done.append(pid)
    except (ProcessLookupError, PermissionError):
      pass
  return done


class Guard:
  """Pauses our own jobs, checks the machine before and after timing (a context manager).

  Attributes:
    ok: after the block, whether the timing may be trusted.
  """

  def __init__(self, *, max_other_cores: float = 0.15, max_drift: float = 1.0,
               window_s: float = 0.5):
    self.max_other_cores = max_other_cores
    self.max_drift = max_drift
    self.window_s = window_s
    self._paused: list[int] = []
    self._watcher: subprocess.Popen | None = None
    self._before: tuple[list[Process], float] | None = None
    self._after: tuple[list[Process], float] | None = None

  def __enter__(self) -> Guard:
    # A job stopped before we came stays stopped when we leave: we resume only what we paused.
    running = [pid for pid in registered_jobs() if not _stopped(pid)]
    self._paused = _signal(running, signal.SIGSTOP)
    try:
      self._watcher = _resume_if_we_die(self._paused)
      self._before = (busy_processes(self.window_s), calibrate())
    except BaseException:
      self._resume()
      raise
    return self

  def __exit__(self, *exc_info: Any) -> None:
    try:
      calibration = calibrate()
      self._after = (busy_processes(self.window_s), calibration)
    finally:
      self._resume()

  def _resume(self) -> None:
    _signal(self._paused, signal.SIGCONT)
    if self._watcher is not None:
      self._watcher.kill()
      self._watcher.wait()
      self._watcher = None

  def _others(self, busy: list[Process]) -> float:
    return sum(p.cores for p in busy)

  @property
  def ok(self) -> bool:
    if self._before is None or self._after is None:
      return False
    (busy0, cal0), (busy1, cal1) = self._before, self._after
    return (self._others(busy0) < self.max_other_cores
            and self._others(busy1) < self.max_other_cores
            and abs(cal1 / cal0 - 1.0) <= self.max_drift)

  def record(self) -> dict[str, Any]:
    """The check as a JSON-serialisable dict (stored in every timed row)."""
    if self._before is None or self._after is None:
      raise RuntimeError("Guard.record() is available after the `with` block has finished.")
    (busy0, cal0), (busy1, cal1) = self._before, self._after
    return {
        "ok": self.ok,
        "other_cores_before": round(self._others(busy0), 3),
        "other_cores_after": round(self._others(busy1), 3),
        "busy_before": [dataclasses.asdict(p) for p in busy0[:3]],
        "busy_after": [dataclasses.asdict(p) for p in busy1[:3]],
        "calibration_ms_before": round(cal0, 3),
        "calibration_ms_after": round(cal1, 3),
        "paused_jobs": self._paused,
        "max_other_cores": self.max_other_cores,
        "max_drift": self.max_drift,
        "enforced": enforced(),
    }

  def explain(self) -> str:
    """Why the check failed, in words (names the busiest processes)."""
    rec = self.record()
    busy = rec["busy_before"] + rec["busy_after"]
    names = ", ".join(f"pid {p['pid']} ({p['command']}, {p['cores']:.2f} cores)" for p in busy)
    return (f"other processes used {rec['other_cores_before']:.2f} / {rec['other_cores_after']:.2f}"
            f" cores before / after (limit {self.max_other_cores}); calibration "
            f"{rec['calibration_ms_before']:.1f} -> {rec['calibration_ms_after']:.1f} ms (limit "
            f"±{self.max_drift:.0%}). Busy: {names or 'none seen'}. Stop or pause them "
            "(kill -STOP PID; kill -CONT PID afterwards) and run again; our own long jobs "
            "register with contention.register_job and are paused automatically.")


@contextlib.contextmanager
def quiet(what: str) -> Iterator[Guard]:
  """A `Guard` that raises `ContentionError` after the block unless the check is ok.

  Args:
    what: the timing's name, for the message.
  """
  guard = Guard()
  with guard:
    yield guard
  if not guard.ok and enforced():
    raise ContentionError(f"{what}: timing refused, {guard.explain()}")


def wait_until_quiet(max_wait_s: float, max_other_cores: float = 0.15,
                     poll_s: float = 5.0) -> list[Process]:
  """Waits (pausing our jobs meanwhile is the caller's business) until the machine is quiet.

  Returns:
    [] once quiet, or the busy processes seen last if `max_wait_s` ran out.
  """
  deadline = time.monotonic() + max_wait_s
  while True:
    registered = set(registered_jobs())
    busy = [p for p in busy_processes() if p.pid not in registered]
    if sum(p.cores for p in busy) < max_other_cores or time.monotonic() >= deadline:
      return busy if sum(p.cores for p in busy) >= max_other_cores else []
    time.sleep(poll_s)


def main() -> int:
  registered = set(registered_jobs())
  busy = [p for p in busy_processes(window_s=1.0) if p.pid not in registered]
  for p in busy:
    print(f"busy: pid {p.pid} ({p.command}) {p.cores:.2f} cores", file=sys.stderr)
  if registered:
    print(f"our registered jobs (paused around every timing): {sorted(registered)}",
          file=sys.stderr)
  if sum(p.cores for p in busy) >= 0.15:
    print("The machine is busy: timings taken now would be wrong. Stop the processes above "
          "first.", file=sys.stderr)
    return 1
  print("quiet", file=sys.stderr)
  return 0


QUIET_ATTEMPTS = 3  # A timing refused by the guard is taken at most this often.
QUIET_WAIT_S = 600.0


class Attempt:
  """One try of a timed measurement (`attempts`): a context manager around it that, for
  every try but the last, turns the guard's refusal (`ContentionError`) into a wait for a
  quiet machine (`wait_until_quiet`, up to `QUIET_WAIT_S`).

  Attributes:
    number: the try's number, 1..QUIET_ATTEMPTS.
    done: whether its block ran through.
  """

  def __init__(self, number: int, say: Callable[[str], Any]) -> None:
    self.number = number
    self.done = False
    self._say = say

  def __enter__(self) -> Attempt:
    return self

  def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
               traceback: Any) -> bool:
    if kind is None:
      self.done = True
      return False
    if not issubclass(kind, ContentionError) or self.number == QUIET_ATTEMPTS:
      return False
    self._say(f"{error}\nWaiting up to {QUIET_WAIT_S:.0f} s for a quiet machine (attempt "
              f"{self.number} of {QUIET_ATTEMPTS}).")
    wait_until_quiet(QUIET_WAIT_S)
    return True


def attempts(say: Callable[[str], Any]) -> Iterator[Attempt]:
  """The tries of a timed measurement, until one runs through:

    for attempt in contention.attempts(say):
      with attempt:
        row = measure()  # its timings under the guard (`quiet`)

  A try whose timing the guard refused waits for a quiet machine and the next one
  measures again, `QUIET_ATTEMPTS` tries at most; the last one's refusal is raised, as is
  any other error at once. The measurement stays with the caller: nothing of it passes
  through here.

  Args:
    say: reports each wait.
  """
  for number in range(1, QUIET_ATTEMPTS + 1):
    attempt = Attempt(number, say)
    yield attempt
    if attempt.done:
      return


if __name__ == "__main__":
  sys.exit(main())
