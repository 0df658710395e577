"""The sandbox: the project's one trust boundary. Everything a model writes runs here and nowhere else.

Trusted side (the judging process): `executor` (the front door: `execute_program`, `execute_many`, the
re-scoring CLI `python -m sandbox.executor`; it re-exports what callers need), `judge` (plans a
task's tests into jobs, sequences a verdict's runs through the callable the executor gives it, judges the
replies; expected values never leave this side) and `pool` (the
pre-started workers and the pipes to them; it trusts nothing a worker sends).

Untrusted side: `worker`, run by the pool as its own process (`python -I worker.py`, standard library
only), hosts the program processes (namespaces, uid, cgroup and rlimits where the host allows); its
pieces, one per kind of process, are `supervisor`, `zygote`, `harness` (the program process) and
`isolation` (system calls, root file system, cgroup). The judging side imports none of them.

`protocol` (standard library only) is the wire format, the one module both sides import.

The package imports only `utils/` (it knows nothing of models, phases or the config); the rest of the
project imports the sandbox through `sandbox.executor`. Importing this package imports nothing.
The judging process never imports the worker (a test checks it).

Limits: a pool owns its `SandboxLimits`.
`SandboxPool.from_config(config.sandbox)` builds every product pool.
The environments, scoring and phase 4 take the limits from their pool.
`limits=` on `execute_program` and `execute_many` is a per-call override, for tests and the re-scoring CLI.
`task_secret_paths(config)` lists what every pool hides (phase 4 adds its eval file).
A pool started with less than namespaces plus a memory cgroup warns (`SandboxIsolationWarning`).

Replies: the pool reads them under deadlines and a size bound, and decodes values with depth and shape checks.
A malformed value becomes an `Opaque` that equals nothing.
Any error replaces the worker and fails that one program; `execute_many` never loses a batch.
The supervisor bounds what one reply carries (`Supervisor._record`).

Timing (`Supervisor`): a run's clock starts at the ready byte.
A report counts only if it arrives within one `test_timeout`.
That time is charged as CPU time of the worker's CPU cgroup (`isolation.CpuGroup`, which the zygote joins, so every
program is born inside) where the host has one.
Wall clock is only the backstop, at `SandboxLimits.wall_factor` times, so a neighbour's busy children cannot time
out an honest program.
All tests first run in one process; a report inside that window proves that test was fast enough.
Each test left without a report re-runs alone in a fresh process.
Why not one process per test from the start: a fork of the warm interpreter costs milliseconds, and several per
MBPP task would lose the speed target.
Why not bubblewrap or nsjail: they start a fresh interpreter per program, far slower than a fork.

Signals: the supervisor and the zygote ignore SIGINT.
A terminal's Ctrl-C reaches the whole foreground group, and what it means is the parent's to decide: it closes the
job pipe, or dies and `PDEATHSIG` follows.
A program process restores Python's handler once it has its own session.
"""
