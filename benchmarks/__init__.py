"""Research benchmarks on today's code, each one `python -m benchmarks NAME [flags]`.

Not commands a user needs to run the project (those are `experiments/`): each times or
profiles one part of it, and some wrote a committed result (results/README.md names
which). `__main__.BENCHMARKS` lists them.
"""
