"""The commands' persistent compilation cache: where it goes, what wins, and when it is off."""

import os

import jax
import pytest

from specdec_jax import compilation_cache


@pytest.fixture
def jax_cache_allowed():
  """JAX's cache switched on for one test (the suite runs with it off, see conftest)."""
  before = jax.config.jax_enable_compilation_cache
  # Held from here: the test may stub `jax.config.update` (monkeypatch), and its stub can
  # still be in place when this fixture tears down.
  update = jax.config.update
  update("jax_enable_compilation_cache", True)
  yield
  update("jax_enable_compilation_cache", before)


def test_the_cache_is_in_the_users_cache_directory_unless_jaxs_variable_names_one(
    jax_cache_allowed, monkeypatch, tmp_path):
  del jax_cache_allowed
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


def test_jaxs_own_switch_turns_the_cache_off(monkeypatch, tmp_path):
  monkeypatch.setattr(jax.config, "update", lambda name, value: pytest.fail(name))
  monkeypatch.delenv(compilation_cache.ENV, raising=False)
  assert not jax.config.jax_enable_compilation_cache  # JAX_ENABLE_COMPILATION_CACHE=false.
  assert compilation_cache.enable(str(tmp_path / "cache")) is None
  assert not os.path.exists(tmp_path / "cache")
