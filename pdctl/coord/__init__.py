"""The coordination store (etcd): its certificates, its health, and the client pdctl uses."""
