"""Mapping keys and document boundaries as kubectl reads them (issue 38, item 12).

kubectl cuts a file into documents before any YAML is parsed (k8s.io/apimachinery/pkg/util/yaml, YAMLReader.Read):
at every line that starts with `---`, which may be followed by spaces and a comment only ("invalid Yaml document
separator" otherwise), wherever that line is, even inside a quoted scalar. Each piece goes to sigs.k8s.io/yaml,
whose go-yaml v2 Unmarshal reads its first document only, and whose convertToJSONableObject writes non-string keys
as JSON keys: an int as its decimal, a bool as true/false, a float as strconv.FormatFloat(key, 'g', -1, 32) (so
rounded to float32, with %e from 1e6 on), an infinity as .inf; any other key type (uint64, null) is an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpjob_operator import cli, kubeyaml, validation

JOB = "apiVersion: elastic.ddp.dev/v1alpha1\nkind: DDPJob\nmetadata: {name: %s}\nspec: {replicas: 1, image: t, entrypoint: m}\n"


def _load(text: str) -> list:
    return list(kubeyaml.load_all(text, max_values=1000, max_depth=20))


def _validate(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_bytes(text.encode())
    code = cli.main(["validate", str(path)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out + captured.err


# (key as written, the JSON key kubectl sends)
KEYS = [
    ("a", "a"), ("'1e6'", "1e6"), ("y", "true"), ("off", "false"), ("0x10", "16"), ("0o17", "15"), ("-1_000", "-1000"),
    ("9223372036854775807", "9223372036854775807"), ("-9223372036854775808", "-9223372036854775808"),
    ("2024-01-02", "2024-01-02"),  # a timestamp key keeps its text (decode.go, d.scalar)
    # Floats: FormatFloat(key, 'g', -1, 32): the shortest decimal of the float32, %e below 1e-4 and from 1e6 on.
    ("1e1", "10"), ("1.0", "1"), ("1.5", "1.5"), ("0.1", "0.1"), ("100000.0", "100000"), ("1e6", "1e+06"),
    ("1234567.0", "1.234567e+06"), ("16777217.0", "1.6777216e+07"), ("3.14159265358979", "3.1415927"),
    ("0.0001", "0.0001"), ("0.00001", "1e-05"), ("-0.0", "-0"), ("1e39", ".inf"), ("-1e39", "-.inf"),
    ("3.4028235e38", "3.4028235e+38"), ("99999999999999999999", "1e+20"),  # beyond uint64: a float (yamlStyleFloat)
    (".5_0", "0.5"), ("0.33333333333", "0.33333334"), ("1e-50", "0"),
    (".inf", ".inf"), ("-.Inf", "-.inf"), (".nan", ".nan"), ("!!float 1", "1"),
]


@pytest.mark.parametrize("key, expected", KEYS, ids=[k for k, _ in KEYS])
def test_a_key_is_the_json_key_kubectl_sends(key, expected):
    assert _load(f"{key}: v\n") == [{expected: "v"}]


@pytest.mark.parametrize("key", [
    "9223372036854775808", "18446744073709551615",  # go-yaml resolves these to uint64: "unsupported map key"
    "0x1FFFFFFFFFFFFFFFF",  # beyond uint64 with a base prefix: text to go-yaml v2.4, a big.Int to sigs.k8s.io's fork
    "~", "null", "? [a]", "? {a: 1}",  # a null key; a list or mapping key (decode.go: "invalid map key")
])
def test_a_key_kubectl_refuses_is_refused(tmp_path, capsys, key):
    text = f"{key}: v\n" if not key.startswith("?") else f"{key}\n: v\n"
    code, out = _validate(tmp_path, text, capsys)
    assert code == validation.EXIT_INVALID
    assert "line 1" in out and "Fix: quote" in out


def test_two_keys_that_kubectl_writes_alike_are_duplicates(tmp_path, capsys):
    code, out = _validate(tmp_path, "1e6: a\n1000000.0: b\n", capsys)
    assert code == validation.EXIT_INVALID and "duplicate key '1e+06' (first at line 1)" in out


# ---------------------------------------------------------------- documents, as kubectl cuts the file


def test_a_separator_followed_by_a_comment_separates(tmp_path, capsys):
    code, out = _validate(tmp_path, JOB % "one" + "---# the second job\n" + JOB % "two", capsys)
    assert code == 0, out
    assert "valid DDPJob one" in out and "valid DDPJob two" in out


@pytest.mark.parametrize("line", ["--- {kind: List}", "----", "---x", "--- |"])
def test_a_separator_followed_by_content_is_refused_as_kubectl_refuses_it(tmp_path, capsys, line):
    code, out = _validate(tmp_path, JOB % "one" + line + "\n" + JOB % "two", capsys)
    assert code == validation.EXIT_INVALID
    assert "line 5, column 1" in out and "invalid Yaml document separator" in out


@pytest.mark.parametrize("separator", ["---", "---#", "--- # c"])
def test_a_separator_line_inside_a_quoted_scalar_ends_the_document(tmp_path, capsys, separator):
    # kubectl cuts at the line whatever the quotes; the first piece then ends inside the quoted name.
    text = f'apiVersion: elastic.ddp.dev/v1alpha1\nkind: DDPJob\nmetadata:\n  name: "one\n{separator}\ntwo"\n'
    code, out = _validate(tmp_path, text, capsys)
    assert code == validation.EXIT_INVALID
    assert "line 5" in out and "kubectl ends the document at the `---` of line 5, even inside quotes" in out


def test_a_line_that_only_starts_like_a_separator_inside_quotes_is_text():
    # Not at column 0, or `--` only: no separator for kubectl or for YAML.
    assert _load('a: "x\n ---\n--y"\n') == [{"a": "x --- --y"}]


@pytest.mark.parametrize("directive", ["%YAML 1.1", "%YAML 1.2", "# header\n%TAG !e! tag:example.com,2000:"])
def test_a_directive_is_refused_as_kubectl_cannot_read_it(tmp_path, capsys, directive):
    # The `---` after a directive is a separator to kubectl: the directive is read alone, and go-yaml fails with
    # "did not find expected <document start>".
    code, out = _validate(tmp_path, f"{directive}\n---\n" + JOB % "one", capsys)
    assert code == validation.EXIT_INVALID
    assert "a %YAML or %TAG directive" in out and "Fix: remove the directive line" in out


@pytest.mark.parametrize("break_", ["\r", "\u2028", "\x85"])
def test_a_second_document_kubectl_does_not_see_is_refused(tmp_path, capsys, break_):
    # kubectl splits lines at \n only, and go-yaml's Unmarshal reads a piece's first document: the second job
    # would be validated here and never sent.
    code, out = _validate(tmp_path, (JOB % "one").rstrip("\n") + f"{break_}---{break_}" + JOB % "two", capsys)
    assert code == validation.EXIT_INVALID
    assert "a second YAML document that kubectl does not read" in out


def test_a_scalar_tagged_with_the_non_specific_tag_is_refused(tmp_path, capsys):
    # go-yaml keeps `! 10` as the text "10" (resolve.go: "!" is not a resolvable tag); libyaml resolves it as 10.
    code, out = _validate(tmp_path, (JOB % "one").replace("replicas: 1", "replicas: ! 10"), capsys)
    assert code == validation.EXIT_INVALID and "the non-specific tag `!`" in out and "line 4" in out


def test_crlf_line_ends_are_line_ends(tmp_path, capsys):
    code, out = _validate(tmp_path, (JOB % "one" + "---\n" + JOB % "two").replace("\n", "\r\n"), capsys)
    assert code == 0, out
