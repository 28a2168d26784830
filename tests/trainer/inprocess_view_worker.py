"""Run by the in-process view tests (issue 36): a trainer on `Job` with a tiny model and a fixed time per step, so
that a test sees who trains in which view, step by step. One line per step: `step S seat E rank R of N view G:K
pid P time T`; at the end `done step S sum X` (X: the parameters' sum, equal on every rank whose state agrees).

VIEW_STEPS: steps to train; VIEW_STEP_S: seconds per step (a sleep after it); VIEW_DIE_AT: this process SIGKILLs
itself right after that step (in its first generation only), as a crash would end it; VIEW_BUILD_S: seconds its
build takes (a sleep between `Job.start(build_first=True)` and `resume()`, as a large model's initialisation)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_trainer.runtime import Job, exit_process

STEPS, STEP_S = int(os.environ["VIEW_STEPS"]), float(os.environ.get("VIEW_STEP_S", "0.1"))
DIE_AT, BUILD_S = int(os.environ.get("VIEW_DIE_AT", "0")), float(os.environ.get("VIEW_BUILD_S", "0"))
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stdout)


def main() -> int:
    with Job.start(device="cpu", timeout_s=60, build_first=True) as job:  # the place is taken in resume()
        torch.manual_seed(0)
        module = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
        time.sleep(BUILD_S)
        progress = {"step": 0}

        def state() -> dict:
            return {"model": module.state_dict(), "optimizer": optimizer.state_dict(), "progress": dict(progress)}

        def load(given: dict) -> None:
            module.load_state_dict(given["model"])
            optimizer.load_state_dict(given["optimizer"])
            progress.update(given["progress"])

        resumed = job.resume()
        born_in = job.view.generation
        if resumed is not None:
            load(resumed)
            print(f"resumed step={progress['step']} from peer rank {resumed['ddpjob'].get('peer')}", flush=True)
        model = [DDP(module, init_sync=not job.replicas_agree)]
        job.carry(state=state, load=load, step=lambda: progress["step"], rescue=False,
                  rewrap=lambda: model.__setitem__(0, DDP(module, init_sync=False)),
                  release=lambda: model.__setitem__(0, None))
        while progress["step"] < STEPS:
            try:
                loss = model[0](torch.full((8, 4), float(job.seat + 1))).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                progress["step"] += 1
                view = job.view
                print(f"step {progress['step']} seat {job.seat} rank {job.env.rank} of {job.env.world_size} view "
                      f"{view.generation}:{view.round} pid {os.getpid()} time {time.time():.3f}", flush=True)
                if progress["step"] == DIE_AT and view.generation == born_in:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(STEP_S)
                job.report(step=progress["step"], loss=float(loss.detach()))
                if job.should_stop():
                    return job.stop.exit_code
            except Exception as e:  # noqa: BLE001 - a peer's failure: in process, or out as before
                if job.recover(e):
                    continue
                raise
        total = sum(float(p.detach().double().sum()) for p in module.parameters())
        print(f"done step {progress['step']} sum {total!r}", flush=True)
    return 0


if __name__ == "__main__":
    exit_process(main())
