"""The real-workload suite: others' training loops, from registry packages, in every mode.

``python -m benchmarks.workloads`` prints the table; ``tests/workloads`` runs its correctness
half in CI. ``catalog`` holds the workloads, ``harness`` runs and compares them.
"""
