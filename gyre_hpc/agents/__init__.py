"""Agent workloads: the synthetic long-horizon agent environment (pure) and the harness that runs it live.

- ``task``        token layout, task generator, the deterministic verifier (pure);
- ``env``         ``Episode``: one run as a generator of model calls and tool waits, branching rules, outcomes (pure);
- ``workload``    a seeded workload of groups, engine sampling params, and ``play`` with virtual time (pure);
- ``harness``     runs groups concurrently against any SGLang-protocol URL and writes TITO + outcomes (edge);
- ``closed_loop`` engine → harness → trajectory pipeline → Trainer → weights back to the engine (edge).

The workload is described in ``docs/agent-workload.md``.
"""
