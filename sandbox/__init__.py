"""The sandbox: the project's one trust boundary. Everything a model writes runs here and nowhere else.

Trusted side (the judging process): `executor` (the front door: `execute_program`, `execute_many`, the
re-scoring CLI `python -m sandbox.executor`; it re-exports what callers need), `judge` (pure: plans a
task's tests into a job and judges the reply; expected values never leave this side) and `pool` (the
pre-started workers and the pipes to them; it trusts nothing a worker sends).

Untrusted side: `worker`, run by the pool as its own process (`python -I worker.py`, standard library
only), hosts the program processes (namespaces, uid, cgroup and rlimits where the host allows); its
pieces, one per kind of process, are `supervisor`, `zygote`, `harness` (the program process) and
`isolation` (system calls, root file system, cgroup). The judging side imports none of them.

`protocol` (standard library only) is the wire format, the one module both sides import.

The package imports only `utils/` (it knows nothing of models, phases or the config); the rest of the
project imports the sandbox through `sandbox.executor`. Importing this package imports nothing.
"""
