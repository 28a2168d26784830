"""The names and namespaces that go into an API request's path, checked before anything is sent.

An empty name turns an object's URL into its collection's: a DELETE there is deletecollection, every object of
the namespace (`ddpjob delete "$JOB"` with JOB unset removed every DDPJob, its pods and checkpoint claims). '/',
'%', '.' and '..' move the URL to another path (the API server's path-segment rule), '?' and '#' end the path. So
every name and namespace is checked against what the API server allows for its kind before the first request,
and every path segment is percent-escaped as well (`segment`).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from . import k8s_fields, model


class InvalidName(ValueError):
    """A name or namespace no object can have: the message names the argument and the fix."""


@dataclass(frozen=True)
class NameRule:
    what: str  # "a DDPJob name"
    pattern: str
    max_length: int | None
    form: str  # what a valid one looks like, for the fix
    empty_addresses: str  # what a request's URL addresses when this name is left out

    def fix(self) -> str:
        return f"give {self.what}: {self.form}" + (f", at most {self.max_length} characters" if self.max_length else "")


JOB_NAME = NameRule("a DDPJob name", model.DNS_1035_PATTERN, model.MAX_JOB_NAME_LENGTH,
                    "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit "
                    "(DNS-1035 label)", "every DDPJob of the namespace")
NAMESPACE = NameRule("a namespace", k8s_fields.DNS_1123_LABEL, 63,
                     "lowercase letters, digits and '-', starting and ending with a letter or digit (DNS-1123 label)",
                     "the objects of every namespace")
POD_NAME = NameRule("a pod name", model.DNS_1123_SUBDOMAIN_PATTERN, 253,
                    "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit "
                    "(DNS-1123 subdomain)", "every pod of the namespace")
# What any object's name may be in a URL (apimachinery's IsValidPathSegmentName), whatever its kind.
PATH_SEGMENT = NameRule("a name", r"^[^/%]+$", None, "no '/' or '%', not '.' or '..'",
                        "every object of the collection")


def check(value: Any, rule: NameRule, argument: str) -> str:
    """`value` when an object of `rule`'s kind can have it; else InvalidName naming `argument` and the fix."""
    if not isinstance(value, str):
        raise InvalidName(f"{argument} must be a string, not {type(value).__name__} {value!r}. Fix: {rule.fix()}")
    if not value:
        raise InvalidName(f"{argument} is empty: the request would address {rule.empty_addresses} (a delete "
                          f"would remove them all). Fix: {rule.fix()} (an unset shell variable expands to nothing)")
    if value in (".", "..") or "/" in value or "%" in value:
        raise InvalidName(f"{argument} {value!r} may not be '.' or '..' or hold '/' or '%': it would make the "
                          f"request's URL another one. Fix: {rule.fix()}")
    if (rule.max_length and len(value) > rule.max_length) or not re.fullmatch(rule.pattern, value):
        raise InvalidName(f"{argument} {value!r} is not {rule.what} the API server accepts. Fix: {rule.fix()}")
    return value


def segment(value: str) -> str:
    """One segment of a request's path, percent-escaped ('?', '#' and ' ' included): a second line of defence
    behind `check`, so a value can only ever name itself."""
    return urllib.parse.quote(value, safe="")
