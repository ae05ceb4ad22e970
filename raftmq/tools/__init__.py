"""Local clusters of real processes, failover drills and demos, for the demo command,
the process tests, jepsen and bench. Above every other package: nothing in ``raftmq``
imports it."""
