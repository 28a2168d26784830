"""One budget per file, not per document (issue 38, item 11): the values a file may hold with its aliases expanded,
and the documents it may hold, count all its documents together. Per document, 1,650 documents of 13-level alias
doubling (half a megabyte) each stayed under the limit, and `validate`, `render` and `submit` spent 5 CPU-minutes
on them; the file-wide cases with their CPU time are in test_yaml_reads_as_kubectl.py (HOSTILE)."""

from __future__ import annotations

import pytest

from ddpjob_operator import cli, kubeyaml, validation

MAX_VALUES = 1_000


def _doubling(levels: int) -> str:
    """A document whose last anchor expands to 2**levels scalars (plus the lists holding them)."""
    return "a0: &a0 [x, x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, levels))


def _load(text: str, **limits) -> list:
    return list(kubeyaml.load_all(text, **{"max_values": MAX_VALUES, "max_depth": 20, **limits}))


def test_one_document_under_the_budget_is_read_whole():
    [doc] = _load(_doubling(7))  # 509 values with its aliases expanded
    assert len(doc["a6"]) == 2 and doc["a6"][0][0][0][0][0][0] == ["x", "x"]


def test_documents_under_the_budget_each_are_refused_together():
    one = _doubling(7)
    with pytest.raises(kubeyaml.KubectlError) as refused:
        _load(one + "---\n" + one)
    assert refused.value.problem == f"aliases expand to more than {MAX_VALUES} values in the file"
    assert refused.value.problem_mark.line == one.count("\n") + 1  # the second document's first line


def test_the_values_written_out_count_for_the_whole_file_too():
    document = "".join(f"k{i}: v\n" for i in range(300))  # 601 values
    assert len(_load(document)) == 1
    with pytest.raises(kubeyaml.KubectlError, match=f"more than {MAX_VALUES} values in the file"):
        _load(document + "---\n" + document)


def test_documents_beyond_the_limit_are_refused_even_empty():
    # Each piece costs a parser, so a file of nothing but `---` lines is cut short too.
    assert _load("---\na: 1\n" * 10, max_documents=10) == [{"a": 1}] * 10
    for piece in ("---\na: 1\n", "---\n", "---\n# nothing\n"):
        with pytest.raises(kubeyaml.KubectlError, match="more than 10 documents in the file"):
            _load(piece * 11, max_documents=10)


@pytest.mark.timeout(60)
def test_the_issues_file_is_refused_by_validate_naming_the_budget(tmp_path, capsys):
    # 1,650 documents of 13-level doubling in a field passed through to the pods: 59 values each as written
    # (97,350 in the file, under the budget), 32,000 each with the aliases expanded.
    document = "spec:\n  template:\n    affinity:\n" + "".join(f"      {line}\n" for line in _doubling(13).splitlines())
    path = tmp_path / "lol.yaml"
    path.write_text(("---\n" + document) * 1650)
    assert 500_000 < path.stat().st_size < 700_000
    assert cli.main(["validate", str(path)]) == validation.EXIT_INVALID
    err = capsys.readouterr().err
    assert f"aliases expand to more than {validation.MAX_YAML_NODES} values in the file" in err
    assert "refused at line 53, column 1" in err  # the 4th document: three (32,000 values each) fit in the budget
    assert "Traceback" not in err
