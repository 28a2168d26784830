"""The agent's requests to the operator's progress endpoint (a spare's assignment, a survivor's generation): GET
with the pod's progress token, every failure a sentence, never an exception. Part of the pod's agent: the
standard library and contract.py only."""

import os

from .contract import PROGRESS_CA_ENV, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV


def ask_operator(path, timeout):
    # GET <the progress URL's directory>/<path> with the pod's progress token: (the JSON answer, None), (None, None)
    # for 204 (nothing to tell), (None, why) when the operator could not be asked.
    import json, ssl, urllib.error, urllib.request
    url = os.environ.get(PROGRESS_URL_ENV, "")
    if not url:
        return None, f"{PROGRESS_URL_ENV} is empty: the operator has no progress endpoint to answer"
    target = url.rsplit("/", 1)[0] + "/" + path
    try:
        with open(os.environ.get(PROGRESS_TOKEN_ENV, "")) as file:
            token = file.read().strip()
    except OSError as error:
        return None, f"cannot read the pod's progress token: {error}"
    try:
        context = ssl.create_default_context(cadata=os.environ[PROGRESS_CA_ENV]) \
            if os.environ.get(PROGRESS_CA_ENV) else None
        request = urllib.request.Request(target, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            if response.status == 204:
                return None, None
            if response.status != 200:
                return None, f"{target} answered {response.status}"
            body = response.read(65536)
        try:
            return json.loads(body), None
        except ValueError as error:
            return None, f"{target} answered 200 with no JSON: {error}"
    except urllib.error.HTTPError as error:  # 401 no valid token, 503 a standby replica, ...
        detail = error.read(200).decode("utf-8", "replace").strip() if error.fp is not None else ""
        return None, f"{target} answered {error.code} {error.reason}" + (f": {detail}" if detail else "")
    except Exception as error:  # unreachable (a NetworkPolicy), a CA it cannot verify, a timeout
        return None, f"cannot reach {target}: {type(error).__name__}: {error}"
