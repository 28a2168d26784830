"""Entry point: `torchrun ... -m ddp_trainer --workload digits ...` (see docs/launch-contract.md)."""

from __future__ import annotations

import logging
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from .config import parse_config
from .distributed import DistEnv, destroy_process_group, init_process_group, select_device
from .trainer import Trainer


@record  # an exception is written to torchrun's error file and the worker exits non-zero
def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)
    env = DistEnv.from_env()
    logging.basicConfig(level=logging.INFO if env.is_main else logging.WARNING,
                        format=f"%(asctime)s rank{env.rank} %(levelname)s %(name)s: %(message)s")
    logging.getLogger(__name__).info("rank=%d world_size=%d group_rank=%d restart_count=%d workload=%s",
                                     env.rank, env.world_size, env.group_rank, env.restart_count, cfg.workload.name)
    device = select_device(cfg.device, env)
    init_process_group(cfg.dist, env, device)
    trainer, clean = None, False
    try:
        trainer = Trainer(cfg, env, device)
        code = trainer.run()
        clean = True
    finally:
        try:
            if trainer is not None:
                trainer.close(clean)
        finally:
            destroy_process_group()
    log = logging.getLogger(__name__)
    (log.warning if code else log.info)("exiting with code %d", code)
    return code


if __name__ == "__main__":
    sys.exit(main())
