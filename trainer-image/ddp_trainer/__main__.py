"""Entry point: `torchrun ... -m ddp_trainer --workload digits ...` (see docs/launch-contract.md)."""

from __future__ import annotations

import logging
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record

from .config import ConfigError, parse_config
from .runtime import CheckpointDirError, CheckpointVolumeError, Job, exit_process
from .runtime.checkpoint.errors import record_for_torchrun
from .trainer import Trainer


@record  # an exception is written to torchrun's error file and the worker exits non-zero
def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except (CheckpointVolumeError, CheckpointDirError) as e:
        # The volume's fault (75, retried) or the user's configuration (1, permanent): an expected end, one line
        # naming the path and the fix, and the message alone for torchrun (the pod's termination message).
        logging.getLogger(__name__).error("exiting with code %d: %s", e.exit_code, e)
        return e.record()
    except ConfigError as e:
        # The run's configuration (a flag's value, a resume under another seed): permanent, one line naming the
        # field, the message alone for torchrun; a traceback would bury it.
        logging.getLogger(__name__).error("exiting with code 1: %s", e)
        record_for_torchrun(e, when=time.time(), stack=False)
        return 1


def _main(argv: list[str] | None) -> int:
    cfg = parse_config(argv)
    c = cfg.checkpoint
    rank_of_job = _RankOfJob()
    handler = logging.StreamHandler()
    handler.addFilter(rank_of_job)
    logging.basicConfig(level=logging.INFO, handlers=[handler],
                        format="%(asctime)s %(rank)s %(levelname)s %(name)s: %(message)s")
    # build_first: an in-process trainer builds its model before it takes a place (Trainer takes it, in _resume):
    # the view a replacement joins waits for the hand-over, not for this build.
    job = Job.start(device=cfg.device, backend=cfg.dist.backend, timeout_s=cfg.dist.timeout_s,
                    steady_timeout_s=cfg.dist.steady_timeout_s, checkpoint_dir=c.dir or "", keep=c.keep,
                    every_steps=c.every_steps, async_save=c.async_save, build_first=True)
    rank_of_job.job = job
    log = logging.getLogger(__name__)
    seated = job.seated
    if seated:
        _log_start(job, cfg)
    trainer, clean = None, False
    try:
        trainer = Trainer(cfg, job)
        if not seated:
            _log_start(job, cfg)
        code = trainer.run()
        clean = True
    finally:
        if trainer is not None:
            trainer.close(clean)
        else:
            job.close(clean=False)
    (log.warning if code else log.info)("exiting with code %d", code)
    return code


class _RankOfJob(logging.Filter):
    """Names the rank in every line, and shows INFO on rank 0 only, once the job has a place (a warm spare
    logs as `spare` before; before the job started, torchrun's RANK names it)."""

    def __init__(self) -> None:
        super().__init__()
        self.job: Job | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        spare = self.job is not None and self.job.rendezvous is not None and self.job.rendezvous.place_key is not None
        if self.job is None or not (self.job.seated or spare):  # no place yet: torchrun's RANK, INFO on rank 0 only
            rank = os.environ.get("RANK")
            record.rank = f"rank{rank}" if rank is not None else "start"
            return record.levelno >= logging.WARNING or rank in (None, "0")
        env = self.job.env if self.job.seated else None
        record.rank = f"rank{env.rank}" if env is not None else "spare"
        return record.levelno >= logging.WARNING or env is None or env.is_main


def _log_start(job: Job, cfg) -> None:
    env = job.env
    logging.getLogger(__name__).info("rank=%d world_size=%d group_rank=%d restart_count=%d generation=%d workload=%s",
                                     env.rank, env.world_size, env.group_rank, env.restart_count, env.generation,
                                     cfg.workload.name)


if __name__ == "__main__":
    exit_process(main())  # an exception takes the normal path: @record's error file, the traceback
