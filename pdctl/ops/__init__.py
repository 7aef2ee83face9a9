"""Operating a running deployment: status, coordinated restarts, doctor and recovery."""
