"""Issue 31 item 1, the trainer's side: every progress report names the rendezvous generation its trainer
runs in (so the operator never takes a stopping survivor's last report for the next generation's), and
close() sends the newest report before it returns (a trainer's final step reaches the operator before its
process exits, so the status that says Succeeded shows it)."""

from __future__ import annotations


import pytest

from ddp_trainer.runtime import ProgressReporter

from loopback_endpoint import Endpoint


@pytest.mark.parametrize("env, generation", [
    ({"TORCHELASTIC_RUN_ID": "0b1c-uid-g3", "DDPJOB_GENERATION": "2"}, 3),  # torchrun's run id: right for a survivor
    ({"DDPJOB_GENERATION": "4"}, 4),
    ({}, None),  # not under a DDPJob: nothing claimed
    ({"DDPJOB_GENERATION": "x"}, None),  # progress is advisory: never an error
])
def test_each_report_names_the_trainers_rendezvous_generation(env, generation):
    with Endpoint() as endpoint:
        reporter = ProgressReporter.from_env({"RANK": "1", "LOCAL_RANK": "0", "DDPJOB_PROGRESS_URL": endpoint.url,
                                              **env})
        reporter.report(step=7)
        reporter.close()
    assert [(b["step"], b["rank"], b["generation"]) for b in endpoint.bodies] == [(7, 1, generation)]


def test_close_sends_the_newest_report_before_it_returns():
    with Endpoint() as endpoint:
        reporter = ProgressReporter(None, endpoint.url, rank=0, min_interval_s=60.0, generation=0)
        reporter.report(step=1, total_steps=3)
        # The next POST waits a minute (the pace): the final step is still pending when training ends.
        reporter.report(step=2, total_steps=3)
        reporter.report(step=3, total_steps=3)
        reporter.close()
        sent = [b["step"] for b in endpoint.bodies]
    assert sent[-1] == 3 and len(sent) <= 2, sent  # the first, maybe, and the last; never lost


def test_the_generation_follows_the_process_into_the_next_one(monkeypatch):
    """In-process recovery (DDPJOB_INPROCESS) keeps the trainer's process and publishes its new generation
    in its environment: the reports of the process's own reporter follow."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g0")
    with Endpoint() as endpoint:
        reporter = ProgressReporter(None, endpoint.url, rank=0, min_interval_s=0.0)
        reporter.report(step=1)
        reporter.flush()
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "uid-g1")
        reporter.report(step=2)
        reporter.close()
    assert [(b["step"], b["generation"]) for b in endpoint.bodies][-1] == (2, 1)
    assert (1, 0) in [(b["step"], b["generation"]) for b in endpoint.bodies]
