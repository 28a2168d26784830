"""Run inside a job's pod (`kubectl exec -i <pod> -- python - < post_progress.py URL TOKEN BODY ...`): POST
each (URL, bearer token, JSON body) as the trainer's progress client does, through the operator's Service
and with the pod's CA ($DDPJOB_PROGRESS_CA) for an https endpoint, and print the answers' status codes as a
JSON list. A 503 (a standby replica, or the acting one not labelled yet after a hand-over) is sent again,
within a deadline. Standard library only: the trainer image's Python runs it."""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

RETRY_503_FOR_S = 60.0


def post(url: str, token: str, body: str, context: ssl.SSLContext | None) -> int:
    request = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def main(args: list[str]) -> None:
    if len(args) % 3:
        raise SystemExit("usage: post_progress.py (URL TOKEN JSON-BODY)...")
    ca = os.environ.get("DDPJOB_PROGRESS_CA") or None
    context = ssl.create_default_context(cadata=ca) if ca else None
    answers = []
    for url, token, body in zip(args[0::3], args[1::3], args[2::3]):
        deadline = time.monotonic() + RETRY_503_FOR_S
        code = post(url, token, body, context)
        while code == 503 and time.monotonic() < deadline:
            time.sleep(1)
            code = post(url, token, body, context)
        answers.append(code)
    print(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv[1:])
