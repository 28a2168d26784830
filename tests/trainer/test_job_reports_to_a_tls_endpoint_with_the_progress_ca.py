"""Issue 37 item 1: with the chart's progress TLS on, a worker gets the endpoint's CA as DDPJOB_PROGRESS_CA (PEM),
and every reporter (Job's, the bundled trainer's, the framework callbacks') verifies the endpoint with it. Job's
reporter was built by hand without the CA: an endpoint whose certificate a private CA issued got nothing.
A real torchrun worker running a script on `Job`, against a real HTTPS endpoint."""

from __future__ import annotations

from pathlib import Path

import trustme

from ddp_trainer.runtime import ProgressReporter

from loopback_endpoint import Endpoint
from trainer_harness import PY, base_env, run, tail

SCRIPT = Path(__file__).parent / "scripts" / "job_reports_steps.py"


def test_a_job_scripts_report_reaches_an_https_endpoint_a_private_ca_certified(tmp_path: Path) -> None:
    ca = trustme.CA()
    log = tmp_path / "worker.log"
    with Endpoint(ca=ca) as endpoint:
        env = base_env(DDPJOB_PROGRESS_URL=endpoint.url, DDPJOB_PROGRESS_CA=ca.cert_pem.bytes().decode())
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "--max-restarts=0", str(SCRIPT)]
        assert run(cmd, env, log, timeout=120) == 0, tail(log)
    assert endpoint.bodies, f"the endpoint got no report over HTTPS:\n{tail(log)}"
    assert endpoint.bodies[-1]["step"] == 3 and endpoint.bodies[-1]["total_steps"] == 3


def test_a_ca_that_is_no_pem_text_is_one_warning_naming_the_variable_and_the_fix(tmp_path: Path, caplog) -> None:
    """A path where the PEM belongs (or any text that holds no certificate): training goes on, progress is not
    posted, and one warning says which variable and what it takes."""
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(trustme.CA().cert_pem.bytes().decode())
    with Endpoint(ca=trustme.CA()) as endpoint:
        for value in (str(ca_file), "not a certificate"):
            caplog.clear()
            reporter = ProgressReporter.from_env({"DDPJOB_PROGRESS_URL": endpoint.url, "DDPJOB_PROGRESS_CA": value})
            reporter.report(step=1)
            reporter.close()
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert len(warnings) == 1 and "$DDPJOB_PROGRESS_CA" in warnings[0], warnings
            assert "PEM text" in warnings[0] and "not a file's path" in warnings[0]
    assert endpoint.bodies == []
