"""Entry point: `torchrun ... -m ddp_trainer --workload digits ...` (see docs/launch-contract.md)."""

from __future__ import annotations

import logging

from torch.distributed.elastic.multiprocessing.errors import record

from .config import parse_config
from .runtime import CheckpointVolumeError, Job, exit_process
from .trainer import Trainer


@record  # an exception is written to torchrun's error file and the worker exits non-zero
def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except CheckpointVolumeError as e:  # full or unreadable: the volume's fault, not a bug (exit 75)
        logging.getLogger(__name__).error("exiting with code %d: %s", e.exit_code, e, exc_info=True)
        return e.record()  # the message, not a traceback, goes to torchrun (and the termination message)


def _main(argv: list[str] | None) -> int:
    cfg = parse_config(argv)
    c = cfg.checkpoint
    job = Job.start(device=cfg.device, backend=cfg.dist.backend, timeout_s=cfg.dist.timeout_s,
                    steady_timeout_s=cfg.dist.steady_timeout_s,
                    checkpoint_dir=c.dir or "", keep=c.keep, every_steps=c.every_steps, async_save=c.async_save)
    env, log = job.env, logging.getLogger(__name__)
    logging.basicConfig(level=logging.INFO if env.is_main else logging.WARNING,
                        format=f"%(asctime)s rank{env.rank} %(levelname)s %(name)s: %(message)s")
    log.info("rank=%d world_size=%d group_rank=%d restart_count=%d generation=%d workload=%s", env.rank,
             env.world_size, env.group_rank, env.restart_count, env.generation, cfg.workload.name)
    trainer, clean = None, False
    try:
        trainer = Trainer(cfg, job)
        code = trainer.run()
        clean = True
    finally:
        if trainer is not None:
            trainer.close(clean)
        else:
            job.close(clean=False)
    (log.warning if code else log.info)("exiting with code %d", code)
    return code


if __name__ == "__main__":
    exit_process(main())  # an exception takes the normal path: @record's error file, the traceback
