"""replgate against the floor and against Jupyter Kernel Gateway, measured in one run.

    .venv/bin/python -m bench            # the full run (about 10 minutes)
    .venv/bin/python -m bench --quick    # a short one
    .venv/bin/python -m bench --wait-quiet --only round_trip,cpu

It starts, on this machine: ``replgate serve`` (Docker sandboxes, a warm pool), a second one
with no warm pool (cold starts), kernel_pool in this process, stock ipykernels on the host
driven by jupyter_client (the floor), and Jupyter Kernel Gateway (as shipped, and patched with
TCP_NODELAY to show what stalls it). Each latency figure is p50/p95 over its repetitions, with
contenders interleaved in rounds, and its ratio to its baseline from the same run. The table is
printed and written, with the machine's description, to ``bench/results/latest.json``; the
targets are reported, never asserted. ``docs/benchmarks.md`` reads the figures.
"""
