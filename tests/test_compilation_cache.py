"""The commands' persistent compilation cache: where it goes, and what wins."""

import os

import jax

from specdec_jax import compilation_cache


def test_the_cache_is_in_the_users_cache_directory_unless_jaxs_variable_names_one(
    monkeypatch, tmp_path):
  updates = {}
  monkeypatch.setattr(jax.config, "update", lambda name, value: updates.update({name: value}))
  monkeypatch.delenv(compilation_cache.ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compilation_cache.default_dir() == str(tmp_path / "xdg" / "specdec_jax" / "xla")
  assert compilation_cache.enable(compilation_cache.default_dir()) == str(
      tmp_path / "xdg" / "specdec_jax" / "xla")
  assert os.path.isdir(tmp_path / "xdg" / "specdec_jax" / "xla")
  assert updates == {"jax_compilation_cache_dir": str(tmp_path / "xdg" / "specdec_jax" / "xla"),
                     "jax_persistent_cache_min_compile_time_secs": 0.0}
  updates.clear()
  assert compilation_cache.enable("") is None and not updates  # Off.
  monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "env"))
  assert compilation_cache.enable(str(tmp_path / "flag")) == str(tmp_path / "env")
  assert updates["jax_compilation_cache_dir"] == str(tmp_path / "env")
