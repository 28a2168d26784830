"""Nested, self-validating configuration built from the CLI and the launch-contract environment.

Precedence for checkpoint settings: explicit CLI flag > DDPJOB_* environment variable > default.
Every check raises ConfigError naming the offending field, so a bad job spec fails with a clear
message (exit code 1, recorded by torchrun) instead of a stack trace deep inside training.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, field
from collections.abc import Mapping
from typing import Any

from .runtime.contract import CHECKPOINT_DIR_ENV, CHECKPOINT_INTERVAL_ENV, CHECKPOINT_KEEP_ENV, env_int
from .runtime.views import FULL_BATCH, WHILE_SHORT


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def _require(cond: bool, name: str, msg: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"{name} {msg}, got {value!r}")


@dataclass
class WorkloadConfig:
    name: str = "digits"  # "digits", "synthetic" or an importable module path
    options: dict[str, str] = field(default_factory=dict)  # --workload-option key=value

    def __post_init__(self) -> None:
        _require(bool(self.name), "workload.name", "must be non-empty", self.name)

    def get(self, key: str, default: Any) -> Any:
        """Typed lookup: the option string is converted to the type of the default."""
        if key not in self.options:
            return default
        raw = self.options[key]
        try:
            return type(default)(raw) if not isinstance(default, bool) else raw.lower() in ("1", "true", "yes")
        except ValueError as e:
            raise ConfigError(f"workload.options.{key} must be a {type(default).__name__}, got {raw!r}") from e


@dataclass
class DataConfig:
    batch_size: int = 32  # per rank and micro-step; the global batch is batch_size * world * grad_accum
    eval_batch_size: int = 256
    drop_last: bool = True  # drop < world_size tail samples per epoch instead of repeating some
    shuffle: bool = True
    seed: int = 0
    num_workers: int = 0  # DataLoader worker processes per rank
    # While a rank is missing (in-process recovery): FULL_BATCH, the survivors also train its shard (the global
    # batch and sample order of an undisturbed run); OWN_BATCH, each trains its own (faster, a smaller batch).
    while_short: str = FULL_BATCH

    def __post_init__(self) -> None:
        _require(self.batch_size >= 1, "data.batch_size", "must be >= 1", self.batch_size)
        _require(self.while_short in WHILE_SHORT, "data.while_short", f"must be one of {', '.join(WHILE_SHORT)}",
                 self.while_short)
        _require(self.eval_batch_size >= 1, "data.eval_batch_size", "must be >= 1", self.eval_batch_size)
        _require(self.num_workers >= 0, "data.num_workers", "must be >= 0", self.num_workers)


@dataclass
class OptimConfig:
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd only
    schedule: str = "cosine"  # lr as a function of training progress (samples), see docs/trainer.md
    warmup_fraction: float = 0.0
    grad_accum: int = 1
    grad_clip: float = 0.0  # max global grad norm; 0 disables
    precision: str = "fp32"

    def __post_init__(self) -> None:
        _require(self.optimizer in ("sgd", "adamw"), "optim.optimizer", "must be sgd or adamw", self.optimizer)
        _require(self.lr > 0, "optim.lr", "must be > 0", self.lr)
        _require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0", self.weight_decay)
        _require(self.schedule in ("constant", "cosine", "linear"), "optim.schedule",
                 "must be constant, cosine or linear", self.schedule)
        _require(0 <= self.warmup_fraction < 1, "optim.warmup_fraction", "must be in [0, 1)", self.warmup_fraction)
        _require(self.grad_accum >= 1, "optim.grad_accum", "must be >= 1", self.grad_accum)
        _require(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0", self.grad_clip)
        _require(self.precision in ("fp32", "bf16", "fp16"), "optim.precision", "must be fp32, bf16 or fp16",
                 self.precision)


@dataclass
class CheckpointConfig:
    dir: str | None = None  # None: no checkpoints, no progress/result files
    every_steps: int = 0  # 0: only the final (and SIGTERM) checkpoint
    keep: int = 2
    async_save: bool = False
    rescue: bool = True  # a survivor of a peer's death saves its replica (at most the step in flight lost)

    def __post_init__(self) -> None:
        _require(self.every_steps >= 0, "checkpoint.every_steps", "must be >= 0", self.every_steps)
        # Two, so a crash while writing the newest still leaves a complete previous one.
        _require(self.keep >= 2, "checkpoint.keep", "must be >= 2", self.keep)


# The default steady collective timeout: a silent peer (frozen, or its node gone with its sockets open) fails the
# survivors' next collective this long after they reach it, so that they train on within 10 s of the silence
# (issue 36). It bounds the wait for the slowest rank outside saves and evaluations (relaxed there), not the step
# time: steps under it took at most 1.2 s with a 2-core machine at load 10-14 (docs/benchmarks.md, "A silent peer
# under load"); steps of several seconds can pass it (a 1 GB state's 6 s steps on two saturated cores did once).
STEADY_TIMEOUT_S = 5.0


@dataclass
class DistConfig:
    backend: str = "auto"  # auto: nccl when CUDA is available, gloo otherwise
    timeout_s: float = 1800.0  # collective timeout (also bounds how long ranks wait for a checkpoint write)
    # After the first steps (outside checkpoint saves): a hung or silently lost peer fails the collectives
    # in this time, not NCCL's 10 or Gloo's 30 minutes. 0: keep timeout_s.
    steady_timeout_s: float = STEADY_TIMEOUT_S

    def __post_init__(self) -> None:
        _require(self.backend in ("auto", "nccl", "gloo"), "dist.backend", "must be auto, nccl or gloo", self.backend)
        _require(self.timeout_s > 0, "dist.timeout_s", "must be > 0", self.timeout_s)
        _require(0 <= self.steady_timeout_s <= self.timeout_s, "dist.steady_timeout_s",
                 f"must be between 0 (off) and dist.timeout_s ({self.timeout_s:g})", self.steady_timeout_s)


@dataclass
class ModelConfig:
    """How the model is wrapped: DDP options (torch.nn.parallel.DistributedDataParallel), SyncBatchNorm, compile."""

    find_unused_parameters: bool = False  # needed when some parameters get no gradient in a step
    static_graph: bool = False  # the set of used parameters never changes: lets DDP skip work
    gradient_as_bucket_view: bool = False  # gradients alias the all-reduce buckets: less memory, one copy fewer
    bucket_cap_mb: float = 25.0  # DDP's gradient bucket size
    sync_batchnorm: bool = False  # BatchNorm statistics over all ranks (torch.nn.SyncBatchNorm)
    compile: bool = False  # torch.compile the DDP model (opt-in: compile time is paid at every start)

    def __post_init__(self) -> None:
        _require(self.bucket_cap_mb > 0, "model.bucket_cap_mb", "must be > 0", self.bucket_cap_mb)
        _require(not (self.find_unused_parameters and self.static_graph), "model.static_graph",
                 "cannot be combined with find_unused_parameters (static_graph already handles unused ones)",
                 self.static_graph)


@dataclass
class FaultConfig:
    """Test-only fault injection: one rank fails on purpose at a step (see `fault.py`)."""

    at_step: int = 0  # 0: off; else fail right after optimizer step N, before its checkpoint
    exit_code: int = 1  # 1..255; >= 128 means: kill yourself with signal exit_code-128 (139: SIGSEGV)
    rank: int = 0  # global rank that fails
    generation: int = 0  # only when DDPJOB_GENERATION equals it; -1: in every generation
    hang_at_step: int = 0  # 0: off; else the rank freezes itself (SIGSTOP) right after optimizer step N
    after_training: bool = False  # the rank fails in the work after the last step (before the final evaluation)
    slow_rank: int = -1  # -1: off; else this global rank's own work per step takes slow_factor times as long
    slow_factor: float = 2.0
    node: str | None = None  # faults only on the node named $NODE_NAME == node (a node-specific failure)

    def __post_init__(self) -> None:
        _require(self.at_step >= 0, "fault.at_step", "must be >= 0", self.at_step)
        _require(1 <= self.exit_code <= 255, "fault.exit_code", "must be in 1..255", self.exit_code)
        _require(self.rank >= 0, "fault.rank", "must be >= 0", self.rank)
        _require(self.generation >= -1, "fault.generation", "must be >= -1 (-1: every generation)",
                 self.generation)
        _require(self.hang_at_step >= 0, "fault.hang_at_step", "must be >= 0", self.hang_at_step)
        _require(self.slow_rank >= -1, "fault.slow_rank", "must be >= 0, or -1 (off)", self.slow_rank)
        _require(1.0 <= self.slow_factor <= 100.0, "fault.slow_factor", "must be in 1..100", self.slow_factor)


@dataclass
class TrainConfig:
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    epochs: int = 1
    max_steps: int = 0  # stop (as completed) after this many optimizer steps in total; 0: no cap
    log_every: int = 10
    device: str = "auto"  # auto: cuda:<LOCAL_RANK> when available, else cpu
    # debug: each seat's trained samples as "epoch index" lines in <path>.rank<seat>, each step's loss in <path>.loss
    record_samples: str | None = None
    fault: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        _require(self.epochs >= 1, "epochs", "must be >= 1", self.epochs)
        _require(self.max_steps >= 0, "max_steps", "must be >= 0", self.max_steps)
        _require(self.log_every >= 1, "log_every", "must be >= 1", self.log_every)
        _require(self.device in ("auto", "cpu", "cuda"), "device", "must be auto, cpu or cuda", self.device)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddp_trainer", description="Elastic DDP trainer (run under torchrun)")
    a = p.add_argument
    a("--workload", default="digits", help="digits | synthetic | importable module with build_model/build_datasets")
    a("--workload-option", action="append", default=[], metavar="KEY=VALUE", help="passed to the workload (repeatable)")
    a("--epochs", type=int, default=1)
    a("--max-steps", type=int, default=0, help="cap on total optimizer steps (0: none)")
    a("--batch-size", type=int, default=32, help="per rank and micro-step")
    a("--eval-batch-size", type=int, default=256)
    a("--no-drop-last", action="store_true", help="pad the epoch tail by repeating samples instead of dropping it")
    a("--no-shuffle", action="store_true")
    a("--seed", type=int, default=0)
    a("--num-workers", type=int, default=0)
    a("--while-short", default=FULL_BATCH, choices=WHILE_SHORT,
      help="while a rank is missing (in-process recovery): full-batch, the survivors also train its share of each "
           "step (the global batch and sample order of an undisturbed run); own-batch, each trains only its own "
           "(faster steps, a smaller global batch, the missing ranks' samples of those steps not trained)")
    a("--optimizer", default="adamw", choices=["sgd", "adamw"])
    a("--lr", type=float, default=1e-3)
    a("--weight-decay", type=float, default=0.0)
    a("--momentum", type=float, default=0.9)
    a("--schedule", default="cosine", choices=["constant", "cosine", "linear"])
    a("--warmup-fraction", type=float, default=0.0)
    a("--grad-accum", type=int, default=1)
    a("--grad-clip", type=float, default=0.0)
    a("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    a("--checkpoint-dir", default=None, help="default: $DDPJOB_CHECKPOINT_DIR")
    a("--checkpoint-every", type=int, default=None, help="default: $DDPJOB_CHECKPOINT_INTERVAL_STEPS or 0")
    a("--checkpoint-keep", type=int, default=None, help="default: $DDPJOB_CHECKPOINT_KEEP or 2")
    a("--async-checkpoint", action="store_true", help="write checkpoints from a background thread")
    a("--no-rescue-checkpoint", dest="rescue_checkpoint", action="store_false",
      help="when a peer dies, do not save the surviving replica (resume from the last periodic checkpoint)")
    m = p.add_argument_group("model wrapping (DistributedDataParallel options, SyncBatchNorm, torch.compile)")
    m.add_argument("--ddp-find-unused-parameters", action="store_true")
    m.add_argument("--ddp-static-graph", action="store_true")
    m.add_argument("--ddp-gradient-as-bucket-view", action="store_true")
    m.add_argument("--ddp-bucket-cap-mb", type=float, default=25.0)
    m.add_argument("--sync-batchnorm", action="store_true", help="convert BatchNorm layers to SyncBatchNorm")
    m.add_argument("--compile", action="store_true", help="torch.compile the DDP-wrapped model")
    a("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    a("--dist-timeout", type=float, default=1800.0, help="collective timeout in seconds (start-up, checkpoint saves)")
    a("--dist-steady-timeout", type=float, default=STEADY_TIMEOUT_S,
      help="collective timeout once the first 10 steps ran, outside checkpoint saves: a hung peer fails the "
           "job's collectives in this time (0: --dist-timeout throughout)")
    a("--log-every", type=int, default=10)
    a("--device", default="auto", choices=["auto", "cpu", "cuda"])
    a("--record-samples", default=None, metavar="PATH",
      help="debug: log the sample indices trained per seat (PATH.rank<seat>) and each step's loss (PATH.loss)")
    f = p.add_argument_group("fault injection (tests only: fail on purpose to exercise restarts)")
    f.add_argument("--fault-at-step", type=int, default=0, metavar="N",
                   help="fail right after optimizer step N, before its checkpoint, or after the first step of a "
                        "generation that resumed past N (0: never)")
    f.add_argument("--fault-exit-code", type=int, default=1, metavar="CODE",
                   help="exit with CODE; CODE >= 128 kills the process with signal CODE-128 "
                        "(139: SIGSEGV, 137: SIGKILL)")
    f.add_argument("--fault-after-training", action="store_true",
                   help="fail in the work after the last step (before the final evaluation), as --fault-exit-code "
                        "says, instead of after a step")
    f.add_argument("--fault-hang-at-step", type=int, default=0, metavar="N",
                   help="freeze (SIGSTOP) right after optimizer step N, as a hung process: its peers block in the "
                        "next collective (hang detection: runPolicy.progressDeadlineSeconds); 0: never")
    f.add_argument("--fault-rank", type=int, default=0, metavar="R", help="the global rank that fails (default 0)")
    f.add_argument("--fault-slow-rank", type=int, default=-1, metavar="R",
                   help="global rank R works --fault-slow-factor times as long per step (it sleeps after each step, "
                        "outside any collective): a straggler, in --fault-generation; -1: off")
    f.add_argument("--fault-slow-factor", type=float, default=2.0, metavar="F", help="how much slower (default 2)")
    f.add_argument("--fault-node", default=None, metavar="NAME",
                   help="every fault above strikes every rank where $NODE_NAME is NAME, and nowhere else (the "
                        "rank flags are then ignored; give the pod NODE_NAME from spec.nodeName): a node-specific "
                        "failure that follows the node, not the rank")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--fault-generation", type=int, default=0, metavar="G",
                   help="fail only while $DDPJOB_GENERATION is G (default 0: once, in the first "
                        "generation); -1: in every generation")
    g.add_argument("--fault-every-generation", dest="fault_generation", action="store_const", const=-1,
                   help="same as --fault-generation -1")
    return p


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return env_int(env, name, default)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def parse_config(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> TrainConfig:
    args = build_parser().parse_args(argv)
    env = os.environ if env is None else env
    options = {}
    for item in args.workload_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"workload.options must be KEY=VALUE, got {item!r}")
        options[key] = value
    every = args.checkpoint_every
    if every is None:
        every = _env_int(env, CHECKPOINT_INTERVAL_ENV, 0)
    keep = args.checkpoint_keep if args.checkpoint_keep is not None else _env_int(env, CHECKPOINT_KEEP_ENV, 2)
    return TrainConfig(
        workload=WorkloadConfig(name=args.workload, options=options),
        data=DataConfig(batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
                        drop_last=not args.no_drop_last, shuffle=not args.no_shuffle, seed=args.seed,
                        num_workers=args.num_workers, while_short=args.while_short),
        optim=OptimConfig(optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                          momentum=args.momentum, schedule=args.schedule, warmup_fraction=args.warmup_fraction,
                          grad_accum=args.grad_accum, grad_clip=args.grad_clip, precision=args.precision),
        checkpoint=CheckpointConfig(dir=args.checkpoint_dir or env.get(CHECKPOINT_DIR_ENV) or None,
                                    every_steps=every, keep=keep, async_save=args.async_checkpoint,
                                    rescue=args.rescue_checkpoint),
        dist=DistConfig(backend=args.backend, timeout_s=args.dist_timeout, steady_timeout_s=args.dist_steady_timeout),
        model=ModelConfig(find_unused_parameters=args.ddp_find_unused_parameters,
                          static_graph=args.ddp_static_graph,
                          gradient_as_bucket_view=args.ddp_gradient_as_bucket_view,
                          bucket_cap_mb=args.ddp_bucket_cap_mb, sync_batchnorm=args.sync_batchnorm,
                          compile=args.compile),
        epochs=args.epochs, max_steps=args.max_steps, log_every=args.log_every, device=args.device,
        record_samples=args.record_samples,
        fault=FaultConfig(at_step=args.fault_at_step, exit_code=args.fault_exit_code, rank=args.fault_rank,
                          generation=args.fault_generation, hang_at_step=args.fault_hang_at_step,
                          after_training=args.fault_after_training,
                          slow_rank=args.fault_slow_rank, slow_factor=args.fault_slow_factor, node=args.fault_node),
    )
