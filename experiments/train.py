"""Trains a T5 (or a shared-encoder draft) on the specdec mixture, resumably; evaluates;
exports (HuggingFace format; a shared-encoder draft in our format, `checkpoints.load_model`).
A gin file that binds `train_student.config` trains a decoder-only draft for a GGUF
target on its stored signals instead (`specdec_jax.training.train_student`).

  python -m experiments.train --gin_file=gin_configs/train/target.gin \
      --model_dir=checkpoints/target [--gin.TrainConfig.total_steps=100] [--eval_only]
  python -m experiments.train --gin_file=gin_configs/train/draft_smollm2.gin \
      --model_dir=checkpoints/draft_smollm2

Writes into `--model_dir`: `checkpoints/` (Orbax, the last few), `hf/` (HF T5 format with
the vocabulary as `spiece.model`) and `train_summary.json`. Rerunning resumes from the
latest checkpoint (SIGTERM / Ctrl-C save one first); a finished run is not retrained
(`specdec_jax.training.train_t5`).
"""

from __future__ import annotations

import fcntl
import os

import gin
from absl import app, flags, logging

from specdec_jax import compilation_cache, contention
from specdec_jax.experiment import gin_flags
from specdec_jax.training import optimizer, trainer
from specdec_jax.training.model_config import model_config
from specdec_jax.training.train_student import train_student
from specdec_jax.training.train_t5 import train

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Run directory (checkpoints, hf/, summary).")
_EVAL_ONLY = flags.DEFINE_bool("eval_only", False,
                               "Evaluate and export the latest checkpoint; no training.")
_COMPILATION_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", compilation_cache.default_dir(),
    "Persistent XLA cache: a resumed run reuses the compiled steps ('' = off).")

LOCK = ".train.lock"


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  model_dir = _MODEL_DIR.value
  if not model_dir:
    raise app.UsageError("--model_dir is required (the run directory).")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every file it writes at INFO.
  # One thread each for tf.data's op pools (the input pipeline); JAX takes the cores.
  # TensorFlow reads these when its runtime starts (the pipeline's first op), after this.
  os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
  os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
  compilation_cache.enable(_COMPILATION_CACHE_DIR.value)
  gin.parse_config_files_and_bindings(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, LOCK), "w") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise SystemExit(f"Another process is training in {model_dir} (it holds "
                       f"{LOCK}); stop it or use another --model_dir.") from None
    # Timing commands pause this run around their measurements (SIGSTOP / SIGCONT).
    contention.register_job(f"train_{os.path.basename(os.path.normpath(model_dir))}")
    # The run's parts, built here from the gin bindings and passed down.
    parts = dict(loss_cfg=trainer.LossConfig(), learning_rate=optimizer.LearningRate(),
                 optimizer_cfg=optimizer.Optimizer())
    if _trains_a_student():
      print(train_student(model_dir, **parts), flush=True)
    else:
      train(model_dir, model_cfg=model_config(), eval_only=_EVAL_ONLY.value, **parts)


def _trains_a_student() -> bool:
  """Whether the gin config binds `train_student.config` (a decoder-only draft)."""
  try:
    gin.query_parameter("train_student.config")
  except ValueError:
    return False
  if _EVAL_ONLY.value:
    raise app.UsageError("--eval_only is for the T5 trainer; a student's run evaluates as it "
                         "trains (alpha_curve.json) and exports when done.")
  return True


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
