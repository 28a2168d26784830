"""The tests `make test` runs alone, after the rest has run on pytest-xdist's workers (Makefile).

They judge wall-clock behaviour (a deadline, a gap, a step time compared between ranks) or CPU
budgets measured close to their bound; a neighbour test's processes on the same two cores would
skew what they measure. They are listed here, not marked in their files, so the list is one place to
read; tests/test_every_test_run_alone_exists.py fails on an entry that names no test.
"""

from __future__ import annotations

import pytest

# file (relative to the repository root) -> the test functions run alone; an empty tuple: every test.
SERIAL: dict[str, tuple[str, ...]] = {
    # "named within the window" and "raises nothing" compare the ranks' step times.
    "tests/local/test_stragglers.py": (),
    # The job is Failed within 2 s of the rank's exit.
    "tests/local/test_missing_callback_and_prompt_user_error.py":
        ("test_one_ranks_runtime_error_fails_the_job_within_two_seconds_of_its_exit",),
    # The frozen peer is caught within 10 s of wall clock.
    "tests/trainer/test_a_silent_peer_is_caught_within_10_seconds_by_default.py": (),
    # The survivors' first step after the kill within 3 s.
    "tests/trainer/test_survivors_train_on_without_waiting_for_a_replacement.py":
        ("test_the_survivors_of_a_kill_train_on_within_seconds_without_a_new_generation_and_finish_short",),
    # Both workers must join within the rendezvous' 1 s last call, or the function runs at world size 1.
    "tests/local/test_function_job.py": ("test_the_function_runs_in_every_process_locally_with_real_torchrun",),
    # Two real agents agree on a stop; beside other tests on a busy machine it ran past its 120 s bound (11 s alone).
    "tests/operator/test_launcher.py": ("test_an_agreed_stop_keeps_the_pod_in_place_unless_its_own_agent_was_signalled",),
    # Lease renewals timed while the loop decides 1,000 jobs.
    "tests/operator/test_lease_renewal_never_waits_on_reconciling.py": (),
    # CPU seconds of validate and render against a 2 s bound they come within 10-20 % of.
    "tests/api/test_a_legal_affinity_of_98000_nodes_is_checked_in_seconds.py": (),
    "tests/api/test_a_file_of_many_worst_case_documents_is_validated_within_2s_of_cpu.py": (),
    "tests/api/test_validate_and_render_answer_within_2s_of_cpu.py": (),
    "tests/api/test_render_of_a_file_of_many_jobs_is_answered_within_2s_of_cpu.py": (),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = SERIAL.get(item.nodeid.split("::", 1)[0])
        if names is not None and (not names or item.originalname in names):
            item.add_marker(pytest.mark.serial)


if __name__ == "__main__":  # `python -m tests.conftest`: the files to collect for the serial part (Makefile)
    print(" ".join(sorted(SERIAL)))
