"""Who trains in a view, and which ranks' data each one trains (issue 36: elastic in place).

A *seat* is a logical rank of the job: replica index x processes per node + local rank, 0..world-1, where
`world` is the generation's full size (its maximum node count x processes per node). The data order, the global
batch and the loss are functions of the seats, never of who is alive: an undisturbed run trains seat s's shard on
the process in seat s.

A *view* is the set of seats whose processes train together in one process group. While it is short (a rank
lost, its replacement not yet there) the missing seats' shards are spread over the members, each member training
its own seat's micro-batches and then those of the missing seats it covers, with gradient accumulation: the
global batch, the sample order and the averaged gradient stay what the full world computes (within float
summation order). `loss_scale` is what each micro-batch's loss is multiplied by so that DDP's mean over the
members equals the full world's mean over seats.

That is the default, `while_short` FULL_BATCH. OWN_BATCH trades it for speed (`view.with_while_short(OWN_BATCH)`):
each member trains its own seat's micro-batches only, its loss unscaled, so a short step's global batch is the
members' and the missing seats' samples of that step are not trained; a whole view trains the same either way.

Pure: no torch, no store; the in-process protocol (inprocess.py) decides the members, the trainer reads this.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FULL_BATCH = "full-batch"  # while short, the members also train the missing seats' shards: the same math
OWN_BATCH = "own-batch"  # while short, each member trains its own shard: faster steps, a smaller global batch
WHILE_SHORT = (FULL_BATCH, OWN_BATCH)


@dataclass(frozen=True)
class View:
    generation: int
    round: int  # 0: the generation's first group; each regroup within a generation (a shrink, a join) counts up
    members: tuple[int, ...]  # seats training in this view, ascending; a member's rank is its index here
    world: int  # the generation's seats (logical world size)
    while_short: str = FULL_BATCH  # what a short view's members train: FULL_BATCH or OWN_BATCH

    def __post_init__(self) -> None:
        if self.while_short not in WHILE_SHORT:
            raise ValueError(f"while_short must be one of {', '.join(WHILE_SHORT)}, got {self.while_short!r}")
        if self.world < 1:
            raise ValueError(f"a view needs a world of at least one seat, got {self.world}")
        if not self.members or list(self.members) != sorted(set(self.members)):
            raise ValueError(f"a view's members are distinct seats in ascending order, got {self.members}")
        if self.members[0] < 0 or self.members[-1] >= self.world:
            raise ValueError(f"a view's members are seats 0..{self.world - 1}, got {self.members}")

    @classmethod
    def whole(cls, generation: int, world: int, round: int = 0) -> "View":
        return cls(generation, round, tuple(range(world)), world)

    def with_while_short(self, while_short: str) -> "View":
        """This view, its members training as `while_short` says when it is short (coverage, loss_scale,
        seats_trained all follow): a script's one call, e.g. `job.view.with_while_short(OWN_BATCH)`."""
        return replace(self, while_short=while_short)

    @property
    def size(self) -> int:
        """Processes in the view's process group (DDP's world size)."""
        return len(self.members)

    @property
    def short(self) -> bool:
        return len(self.members) < self.world

    @property
    def missing(self) -> tuple[int, ...]:
        present = set(self.members)
        return tuple(s for s in range(self.world) if s not in present)

    def rank_of(self, seat: int) -> int:
        """The process-group rank of the member in `seat`."""
        try:
            return self.members.index(seat)
        except ValueError:
            raise ValueError(f"seat {seat} is not a member of view {self.generation}.{self.round} "
                             f"(members {list(self.members)})") from None

    def coverage(self, seat: int) -> tuple[int, ...]:
        """The seats whose data the member in `seat` trains, its own first: the missing seats are dealt to the
        members in seat order, so no member trains more than one shard over any other (OWN_BATCH: none)."""
        rank = self.rank_of(seat)
        if self.while_short == OWN_BATCH:
            return (seat,)
        return (seat, *self.missing[rank::len(self.members)])

    @property
    def seats_trained(self) -> int:
        """Seats whose samples the view trains in each step: the world's, or (OWN_BATCH) the members' alone."""
        return len(self.members) if self.while_short == OWN_BATCH else self.world

    @property
    def loss_scale(self) -> float:
        """Multiply each micro-batch's mean loss by this (and by 1 / micro-batches per seat): DDP averages the
        gradient over `size` members, the step's batch is `seats_trained` seats' (1.0 with OWN_BATCH)."""
        return len(self.members) / self.seats_trained

    def describe(self) -> str:
        if not self.short:
            return f"{self.world} of {self.world} ranks"
        return f"{len(self.members)} of {self.world} ranks (missing {', '.join(map(str, self.missing))})"
