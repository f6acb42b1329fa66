"""Developer tooling, not the call path: the embedded Temporal server, worker processes, the
crashtest, the chaos proxy and the fault kit, doctor."""
