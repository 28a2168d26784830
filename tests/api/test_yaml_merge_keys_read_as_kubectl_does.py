"""Merge keys (`<<`) as kubectl reads them (issue 38, item 10).

go-yaml v2 (decode.go, `d.mapping`) sets a mapping's entries in document order and applies a `<<` where it
stands (`d.merge` unmarshals the merged mapping into the same map), so a merge after an explicit key overrides it;
in a list of merged mappings the earlier wins (`d.merge` walks the list backwards). PyYAML, and the YAML merge
spec, let explicit keys win wherever they stand. `validate` and `render` must never show a value kubectl would
not send: a merge that overrides an explicit key above it is refused, naming the key and both lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpjob_operator import cli, kubeyaml, validation

HEADER = "apiVersion: elastic.ddp.dev/v1alpha1\nkind: DDPJob\n"
# What the CI gate approved above, and what kubectl sends: the merges below override the name and the image.
HIJACKED = HEADER + """\
metadata:
  name: approved
  <<: {name: other-job}
spec:
  replicas: 1
  image: approved:1
  entrypoint: ddp_trainer
  <<: {image: evil:1}
"""


def _run(tmp_path: Path, capsys, verb: str, text: str) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    code = cli.main([verb, str(path)] + (["--no-progress"] if verb == "render" else []))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out + captured.err


@pytest.mark.parametrize("verb", ["validate", "render"])
def test_a_merge_that_overrides_an_explicit_key_above_it_is_refused(tmp_path, capsys, verb):
    code, out = _run(tmp_path, capsys, verb, HIJACKED)
    assert code == validation.EXIT_INVALID
    assert "line 5, column 3" in out and "the merge `<<` overrides 'name' set at line 4" in out
    assert "kubectl applies a merge where it stands" in out and "Fix: move `<<` above 'name'" in out
    assert "approved" not in out.split("overrides")[0]  # nothing rendered or declared valid before the refusal


def test_the_override_is_found_wherever_it_comes_from(tmp_path, capsys):
    # Through an alias, through a list of merges, and through a merge inside the merged mapping.
    for merge in ("<<: *other", "<<: [{x: 1}, *other]", "<<: {<<: *other}"):
        text = HEADER + f"metadata: {{name: approved, labels: &other {{image: evil:1}}}}\n" \
                        f"spec:\n  replicas: 1\n  image: approved:1\n  entrypoint: m\n  {merge}\n"
        code, out = _run(tmp_path, capsys, "validate", text)
        assert code == validation.EXIT_INVALID, merge
        assert "line 8, column 3: the merge `<<` overrides 'image' set at line 6" in out, out


def _load(text: str) -> list:
    return list(kubeyaml.load_all(text, max_values=1000, max_depth=20))


def test_keys_after_a_merge_override_it_as_in_kubectl():
    # decode.go: entries in order, the later set wins; this is also what every YAML reader does.
    assert _load("base: &b {a: 1, b: 1}\nm: {<<: *b, b: 2, c: 2}\n")[0]["m"] == {"a": 1, "b": 2, "c": 2}


def test_in_a_list_of_merges_the_earlier_wins():
    # d.merge: "Step backwards as earlier nodes take precedence."
    [doc] = _load("m: {<<: [{a: 1}, {a: 2, b: 2}, {b: 3, c: 3}]}\n")
    assert doc["m"] == {"a": 1, "b": 2, "c": 3}


def test_a_later_merge_overrides_an_earlier_one():
    # Two `<<` entries: each is applied where it stands, so the second wins.
    assert _load("m: {<<: {a: 1, b: 1}, x: 0, <<: {b: 2}}\n")[0]["m"] == {"a": 1, "b": 2, "x": 0}


def test_a_merge_after_explicit_keys_that_it_does_not_touch_is_accepted(tmp_path, capsys):
    text = HEADER + "metadata: {name: ok}\nspec:\n  replicas: 1\n  entrypoint: m\n  <<: {image: 'trainer:1'}\n"
    code, out = _run(tmp_path, capsys, "validate", text)
    assert code == 0, out
    [job] = validation.load_jobs(tmp_path / "job.yaml")
    assert job.spec.image == "trainer:1"


@pytest.mark.parametrize("merge", ["<<: 1", "<<: [1]", "<<: [[{a: 1}]]", "<<: ~", "<<: *s"])
def test_a_merge_of_anything_but_mappings_is_refused_as_kubectl_refuses_it(tmp_path, capsys, merge):
    # d.merge: failWantMap, "map merge requires map or sequence of maps as the value".
    text = HEADER + f"metadata: {{name: ok, labels: {{s: &s text}}}}\nspec: {{replicas: 1, {merge}}}\n"
    code, out = _run(tmp_path, capsys, "validate", text)
    assert code == validation.EXIT_INVALID
    assert "a merge `<<` takes a mapping or a list of mappings" in out and "line 4" in out


@pytest.mark.parametrize("text, expected", [
    ("v: <<\n", {"v": "<<"}),  # resolve.go maps `<<` to !!merge, which decodes as the text "<<" outside a key
    ('"<<": 1\n', {"<<": 1}),  # isMerge needs a plain (implicit) `<<`: a quoted one is an ordinary key
    ("!!merge x: 1\n", {"x": 1}),  # isMerge also needs the value `<<`
    ("!!merge <<: {a: 1}\n", {"a": 1}),  # ... or the !!merge tag on `<<`
])
def test_what_is_a_merge_and_what_is_text(text, expected):
    assert _load(text) == [expected]


@pytest.mark.parametrize("text", ["&a [*a]\n", "a: &a {b: [*a]}\n", "a: &a {<<: *a}\n"])
def test_an_anchor_inside_itself_is_refused_as_kubectl_refuses_it(tmp_path, capsys, text):
    # decode.go, d.alias: "anchor '%s' value contains itself".
    code, out = _run(tmp_path, capsys, "validate", text)
    assert code == validation.EXIT_INVALID
    assert "an anchor whose value contains itself" in out and "line 1" in out
