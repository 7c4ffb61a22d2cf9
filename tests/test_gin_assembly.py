"""Gin is bound where a command assembles its objects, never in the middle of a library call,
and no library module writes the environment when it is imported.

Every gin-configurable class and function of `specdec_jax` is found by its decorator (the
mesh and axis rules, `partitioning.make_mesh` / `axis_rules` / `draft_axis_rules`, and the
family's `model_config` among them); no function of the library below the assembly module
(`experiment/gin_flags.py`) may create or call one, or read a gin binding: the training
drivers take their optimizer, schedule and loss from the command (`experiments/train.py`).
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "specdec_jax"
ASSEMBLY = PACKAGE / "experiment" / "gin_flags.py"


def _trees() -> dict[pathlib.Path, ast.Module]:
  return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def configurables(trees: dict[pathlib.Path, ast.Module]) -> dict[str, str | None]:
  """The classes and functions decorated with `gin.configurable` (called or not): name ->
  for a function, the module that defines it (a call of another module's function of the
  same name, `jax.make_mesh`, is not one); for a class, None (any call of the name is)."""
  return {node.name: None if isinstance(node, ast.ClassDef) else path.stem
          for path, tree in trees.items() for node in ast.walk(tree)
          if isinstance(node, (ast.ClassDef, ast.FunctionDef))
          and any(ast.unparse(d).startswith("gin.configurable") for d in node.decorator_list)}


def _calls_configurable(callee: ast.expr, known: dict[str, str | None]) -> bool:
  if isinstance(callee, ast.Name):
    return callee.id in known
  if not isinstance(callee, ast.Attribute) or callee.attr not in known:
    return False
  module = known[callee.attr]
  return module is None or ast.unparse(callee.value).split(".")[-1] == module


def gin_reads(tree: ast.Module, known: dict[str, str | None]) -> list[str]:
  """`function: call` for each configurable created or called, or binding read, inside a
  function."""
  found = []
  for function in ast.walk(tree):
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    for call in ast.walk(function):
      if not isinstance(call, ast.Call):
        continue
      if (_calls_configurable(call.func, known)
          or getattr(call.func, "attr", None) == "query_parameter"):
        found.append(f"{function.name}:{call.lineno}: {ast.unparse(call)}")
  return found


def test_the_scan_finds_a_configurable_created_mid_call():
  """Negative control: the scan catches the shapes it forbids, and not a namesake."""
  tree = ast.parse("def load(s):\n  fit = NgramFit()\n  return gin.query_parameter('X.y')\n"
                   "def place():\n  jax.make_mesh((1,), ('data',))\n"
                   "  return partitioning.make_mesh(), make_mesh()\n")
  assert gin_reads(tree, {"NgramFit": None, "make_mesh": "partitioning"}) == [
      "load:2: NgramFit()", "load:3: gin.query_parameter('X.y')",
      "place:6: partitioning.make_mesh()", "place:6: make_mesh()"]


def test_the_library_creates_no_gin_configurable_inside_a_function():
  trees = _trees()
  known = configurables(trees)
  assert {"Settings", "Experiment", "PromptCache", "NgramFit", "GreedyCheck", "make_mesh",
          "axis_rules", "draft_axis_rules", "model_config", "LearningRate", "Optimizer",
          "LossConfig", "StudentTrainConfig"} <= set(known)
  offenders = {str(path.relative_to(PACKAGE)): found for path, tree in trees.items()
               if path != ASSEMBLY and (found := gin_reads(tree, known))}
  assert not offenders, ("Build these where the command assembles its objects "
                         f"(experiment/gin_flags.py) and pass them down: {offenders}")


def environment_writes_at_import(tree: ast.Module) -> list[str]:
  """Module-level statements (outside every function) that write `os.environ`."""
  found = []
  for statement in tree.body:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      continue
    for node in ast.walk(statement):
      text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Assign)) else ""
      if text.startswith(("os.environ.setdefault", "os.environ.update", "os.environ[",
                          "os.putenv")):
        found.append(f"{node.lineno}: {text}")
  return found


def test_the_environment_scan_finds_a_write_at_import():
  tree = ast.parse("import os\nos.environ.setdefault('A', '1')\n"
                   "def main():\n  os.environ['B'] = '2'\n")
  assert environment_writes_at_import(tree) == ["2: os.environ.setdefault('A', '1')"]


def test_no_library_module_writes_the_environment_at_import():
  offenders = {str(path.relative_to(PACKAGE)): found for path, tree in _trees().items()
               if (found := environment_writes_at_import(tree))}
  assert not offenders, f"Set these in the command that needs them: {offenders}"


def test_the_command_builds_the_mesh_and_rules_from_its_gin():
  """`gin_flags.placement` reads `make_mesh`, `axis_rules` and `draft_axis_rules`; the draft
  rules follow the target's (a rule bound for both reaches both)."""
  from specdec_jax import partitioning
  from specdec_jax.experiment import gin_flags

  try:
    gin_flags.parse_gin([], [])
    assert gin_flags.placement() == partitioning.Placement.data_parallel()
    gin_flags.parse_gin([], ["axis_rules.batch = None", "draft_axis_rules.vocab = 'model'",
                             "make_mesh.model = 1"])
    placement = gin_flags.placement()
    assert dict(placement.rules)["batch"] is None and dict(placement.rules)["heads"] == "model"
    assert dict(placement.draft_rules) == {**dict(partitioning.DEFAULT_DRAFT_RULES),
                                           "batch": None, "vocab": "model"}
  finally:
    import gin

    gin.clear_config()
