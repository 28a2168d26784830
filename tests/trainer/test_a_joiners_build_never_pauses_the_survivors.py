"""Join live (issue 36): a replacement takes its place in the view only once its trainer is built
(`Job.start(build_first=True)`, the bundled trainer's way), so the survivors it joins pause for the hand-over
alone. A joiner that arrived at start and built afterwards held them in the state exchange for its whole build: a
1 GB model's allocation and initialisation, seconds."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from inprocess_gang import Gang
from trainer_harness import PY

pytestmark = pytest.mark.slow

WORKER = [PY, str(Path(__file__).with_name("inprocess_view_worker.py"))]
BUILD_S = 6.0  # the replacement's build; the survivors train short meanwhile
STEP_S = 0.2
STEP_TIME = re.compile(r"^step (\d+) seat \d+ rank \d+ of (\d+) view \S+ pid \d+ time ([\d.]+)$", re.M)


def test_the_survivors_do_not_wait_for_a_replacements_build(tmp_path: Path) -> None:
    gang = Gang(tmp_path, "build", [])
    try:
        gang.publish(1, 3, fewest=1)
        env = {"VIEW_STEPS": "70", "VIEW_STEP_S": str(STEP_S)}
        procs = {seat: gang.start(seat, 1, 3, command=WORKER, env={**env, "VIEW_DIE_AT": "5" if seat == 2 else "0"})
                 for seat in range(3)}
        assert gang.wait(procs.pop(2)) == -signal.SIGKILL
        gang.publish(2, 3, fewest=1)
        replacement = gang.start(2, 2, 3, command=WORKER, env={**env, "VIEW_BUILD_S": str(BUILD_S)})
        for proc in (*procs.values(), replacement):
            assert gang.wait(proc, timeout=90) == 0, gang.logs()
        for seat in procs:
            text = gang.text(seat, 1)
            pauses = [float(p) for p in re.findall(r"\(joined: 2\).*a pause of ([\d.]+) s", text)]
            assert len(pauses) == 1, gang.logs()
            lines = [(int(m[1]), int(m[2]), float(m[3])) for m in STEP_TIME.finditer(text)]
            joined_at = next(i for i, (_, size, _) in enumerate(lines) if i > 5 and size == 3)
            gap = lines[joined_at][2] - lines[joined_at - 1][2] - STEP_S
            print(f"seat {seat}: regroup pause {pauses[0]:.2f} s, step gap at the join {gap:.2f} s")
            # Without the build in it, the pause is the group's forming and a tiny model's broadcast.
            assert pauses[0] < BUILD_S / 2 and gap < BUILD_S / 2, gang.logs()
    finally:
        gang.close()
