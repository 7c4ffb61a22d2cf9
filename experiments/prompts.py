"""(Re)writes the committed prompts, assets/prompts/<task>_test.jsonl, from the prepared data.

  python -m experiments.prompts

The first test examples of each corpus, so a fresh checkout (and the device
check) runs without the prepared data (`specdec_jax.data.prompts`).
"""

from __future__ import annotations

from absl import app

from specdec_jax.data import prompts


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  for line in prompts.write_committed_prompts():
    print(line)


if __name__ == "__main__":
  app.run(main)
