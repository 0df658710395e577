"""What measures the product: each script runs its baseline in the same invocation and reports ratios.

Run from the repository root as modules, e.g. `python -m benchmarks.bench_executor --help`; results in
`benchmarks/results/`.
"""
