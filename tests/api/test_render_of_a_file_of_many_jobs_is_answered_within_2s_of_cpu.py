"""`ddpjob render` of a file holding many DDPJobs (issue 38, item 15): each job renders about 50 KB (its agent
ConfigMap), so a 3 MiB file of 5,800 minimal jobs printed 216 MB in 27 s of CPU. Up to MAX_RENDERED_JOBS render within
2 s of CPU (the bound, BLOW_UP_CPU_S, catches a blow-up); more are refused at once, naming the fix. A
namespace no object can have is refused too (it rendered pods in namespace `a/b`)."""

from __future__ import annotations

import pytest

from ddpjob_operator.render_cli import MAX_RENDERED_JOBS

from .worst_cases import BLOW_UP_CPU_S, ddpjob, legal_text, many_documents_text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", ["minimal", "env"])
def test_as_many_jobs_as_render_takes_are_rendered_within_2s_of_cpu(tmp_path, shape):
    path = tmp_path / "jobs.yaml"
    path.write_text(("---\n" + legal_text(shape)) * MAX_RENDERED_JOBS)
    code, cpu = ddpjob("render", path, tmp_path / "out.txt")
    out = (tmp_path / "out.txt").read_text()
    assert code == 0 and out.count("\nkind: ConfigMap\n") == MAX_RENDERED_JOBS, out[-2000:]
    assert cpu < BLOW_UP_CPU_S, f"ddpjob render of {MAX_RENDERED_JOBS} {shape} jobs took {cpu:.2f} s of CPU"


@pytest.mark.timeout(120)
def test_a_file_of_more_jobs_is_refused_at_once_naming_the_fix(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text(many_documents_text("minimal"))
    code, cpu = ddpjob("render", path, tmp_path / "out.txt")
    said = (tmp_path / "out.txt").read_text()
    assert code == 2 and f"render at most {MAX_RENDERED_JOBS} at a time" in said and len(said) < 1000, said[:2000]
    assert cpu < BLOW_UP_CPU_S, f"ddpjob render's refusal took {cpu:.2f} s of CPU"


@pytest.mark.parametrize("namespace", ["a/b", "", "..", "UPPER", "x" * 64])
def test_a_namespace_no_object_can_have_is_refused(tmp_path, namespace):
    path = tmp_path / "job.yaml"
    path.write_text(legal_text("minimal"))
    code, _ = ddpjob("render", path, tmp_path / "out.txt", "-n", namespace)
    said = (tmp_path / "out.txt").read_text()
    assert code == 2 and "--namespace" in said and "Fix:" in said and "kind: Pod" not in said, said[:2000]
