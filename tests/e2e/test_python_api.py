"""The Python API and a Python function as a job on a real cluster: submit() ships the function in a ConfigMap,
the bundled trainer image runs it in both workers with torchrun, the client waits, reads each rank's log, lists
and deletes (the ConfigMap goes with the job)."""

from __future__ import annotations

import re

from ddpjob_operator import client, function_job

from . import cluster


def rank_sum(scale: int = 1) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {value.item():g}", flush=True)
    dist.destroy_process_group()


def test_a_function_job_through_the_python_api(operator, namespace):
    api = client.Client(namespace=namespace)
    job = client.submit(rank_sum, client=api, replicas=2, kwargs={"scale": 10},
                        image=cluster.TRAINER_IMAGE or function_job.DEFAULT_IMAGE, env={"OMP_NUM_THREADS": "1"},
                        resources={"cpu": "250m", "memory": "512Mi"})
    done = api.wait(job.name, timeout=600)
    assert done.phase == "Succeeded" and done.status.restarts == 0
    lines = [line for rank in (0, 1) for line in api.logs(job.name, rank=rank)]
    seen = sorted(m.groups() for line in lines if (m := re.search(r"rank (\d) of 2: sum (\S+)", line)))
    assert seen == [("0", "30"), ("1", "30")]
    assert [j.name for j in api.list()] == [job.name]
    api.delete(job.name, wait=True, timeout=120)
    cluster.wait_for(lambda: cluster.kubectl("get", "configmap", f"{job.name}-function", "-n", namespace,
                                             check=False).returncode != 0,
                     "the function's ConfigMap collected with its job", timeout=120)
