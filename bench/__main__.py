"""``python -m bench``: run the benchmark (see the package docstring)."""

from bench._run import main

main()
