"""The model as pdstack delivers it: checksum manifests, staged revisions, what each host holds
and runs (docs/models.md).

The rollout reads `revisions` (staged_revisions, running_revision) to know what a host can
switch to without a copy; `manifest` makes and checks the checksums; `weights` reads the
safetensors headers (the sim's start-up, the dummy-model generator)."""
