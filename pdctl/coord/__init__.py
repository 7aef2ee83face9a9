"""The fleet's coordination store, etcd: the restart lock as a lease, the restart history,
the gateways' liveness keys (docs/etcd.md); the store's
certificates (pki) and each member's health (health)."""
