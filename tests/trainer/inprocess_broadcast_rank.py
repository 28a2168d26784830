"""One rank of test_inprocess_state_lands_in_the_receivers_own_tensors: rank 0 publishes its state's layout and sends
the state, rank 1 receives it with `into=` its own state as built and `prepared=` the memory it touched from the
layout (runtime/inprocess.broadcast_state over real Gloo, runtime/layout.py), then prints, as JSON, what landed
where. argv: rank, the store's port."""

from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist

from ddp_trainer.runtime.inprocess import BUCKET_BYTES, broadcast_state
from ddp_trainer.runtime.layout import LAYOUT_KEY, describe, prepare, tensors_by_path

rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
LARGE = BUCKET_BYTES // 2 // 4 + 1  # float32 elements: travels alone, as itself


def sent() -> dict:
    g = torch.Generator().manual_seed(7)
    return {"model": {"large": torch.rand(LARGE, generator=g), "small": torch.rand(3, 4, generator=g),
                      "reshaped": torch.rand(6, generator=g), "half": torch.rand(5, generator=g).half()},
            "optimizer": {"state": {0: {"exp_avg": torch.rand(LARGE, generator=g), "step": torch.tensor(9.0)}},
                          "param_groups": [{"lr": 0.1, "params": [0]}]},
            "progress": {"step": 9}}


if rank == 0:
    store.set(LAYOUT_KEY.format(uid="uid"), describe(sent()))
    broadcast_state(sent(), 0, None, torch.device("cpu"))
    print(json.dumps({"rank": 0}), flush=True)
else:
    own = {"model": {"large": torch.zeros(LARGE), "small": torch.zeros(3, 4), "reshaped": torch.zeros(2, 3),
                     "half": torch.zeros(5)},  # a fresh optimizer holds no state yet
           "optimizer": {"state": {}, "param_groups": [{"lr": 0.5, "params": [0]}]}}
    before = {k: t.data_ptr() for k, t in own["model"].items()}
    store.wait([LAYOUT_KEY.format(uid="uid")])
    prepared = prepare(store, "uid", own, torch.device("cpu")).slots
    paths = [path for path, _ in tensors_by_path(sent())]
    half = paths.index(("model", "half"))
    prepared[half] = torch.zeros(5)  # memory of a stale layout (float32 where float16 comes): not received into
    at = {paths[i]: t.data_ptr() for i, t in prepared.items()}
    got = broadcast_state(None, 0, None, torch.device("cpu"), into=own, prepared=prepared)
    want = sent()
    print(json.dumps({
        "rank": 1,
        "equal": all(torch.equal(got["model"][k], want["model"][k]) for k in want["model"]) and
        torch.equal(got["optimizer"]["state"][0]["exp_avg"], want["optimizer"]["state"][0]["exp_avg"]),
        "in_place": sorted(k for k, t in got["model"].items() if t.data_ptr() == before[k]),
        "own_equal_sent": sorted(k for k, t in own["model"].items() if t.shape == want["model"][k].shape and
                                 t.dtype == want["model"][k].dtype and torch.equal(t, want["model"][k])),
        "untouched": sorted(k for k, t in own["model"].items() if not t.any()),
        "prepared": sorted("/".join(map(str, p)) for p, t in tensors_by_path(got) if at.get(p) == t.data_ptr()),
        "stale_untouched": not prepared[half].any(),
        "progress": got["progress"], "lr": got["optimizer"]["param_groups"][0]["lr"],
    }), flush=True)
dist.destroy_process_group()
