"""The job's spec as the API server holds it during a local run: changed as `kubectl scale` and `kubectl patch`
would change it, refused as the CEL rules would refuse it, metadata.generation moving with each change."""

from __future__ import annotations

from .. import model, validation


class JobSpecChanges:
    def __init__(self, spec: model.DDPJobSpec):
        self.spec = spec
        self.metadata_generation = 1  # moves with every spec change, as the API server's does

    def scale(self, replicas: int) -> None:
        """`kubectl scale ddpjob/<name> --replicas=N`: InvalidJob for what the API server's CEL rules
        reject (outside minReplicas..maxReplicas); minReplicas/maxReplicas left unset keep following
        replicas, as they do in the cluster."""
        self._update({**self.spec.wire(), "replicas": replicas})

    def set_suspend(self, suspend: bool) -> None:
        """`kubectl patch ddpjob/<name> --type=merge -p '{"spec":{"runPolicy":{"suspend":...}}}'`."""
        wire = self.spec.wire()
        self._update({**wire, "runPolicy": {**wire.get("runPolicy", {}), "suspend": suspend}})

    def _update(self, wire: dict) -> None:
        spec = validation.parse_spec(wire)
        if spec != self.spec:
            self.spec = spec
            self.metadata_generation += 1
