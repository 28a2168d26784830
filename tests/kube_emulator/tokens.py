"""TokenReview, as the API server answers it for pod-bound projected service-account tokens."""

from __future__ import annotations

import uuid
from typing import Any

from kmock._internal import rendering

from .resources import PODS


class TokenReviews:
    """TokenReview and the tokens a test issues (part of Cluster)."""

    def _review_token(self, request: rendering.Request) -> dict[str, Any]:
        """A TokenReview as the API server answers it for a pod-bound projected service-account token:
        authenticated only for one of the token's audiences, with the pod in user.extra."""
        spec = (request.data or {}).get("spec") or {}
        wanted = list(spec.get("audiences") or ["https://kubernetes.default.svc"])
        issued = self.tokens.get(spec.get("token") or "")
        status: dict[str, Any] = {"authenticated": False, "error": "[invalid bearer token, token lookup failed]"}
        if issued is not None:
            namespace, account, pod, uid, audiences = issued
            common = [a for a in wanted if a in audiences]
            if not common:
                status = {"authenticated": False, "error": "[invalid bearer token, token audiences "
                                                           f"{list(audiences)} is invalid for the target audiences "
                                                           f"{wanted}]"}
            elif self.get(PODS, namespace, pod) is None or self.get(PODS, namespace, pod)["metadata"]["uid"] != uid:
                status = {"authenticated": False, "error": f"[pod {pod} bound to the token no longer exists]"}
            else:
                status = {"authenticated": True, "audiences": common, "user": {
                    "username": f"system:serviceaccount:{namespace}:{account}",
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, account)),
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/pod-name": [pod],
                              "authentication.kubernetes.io/pod-uid": [uid]}}}
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                "spec": spec, "status": status}

    def issue_token(self, namespace: str, pod: str, audiences: tuple[str, ...], account: str = "default") -> str:
        """A projected service-account token bound to the pod as it exists now (its uid)."""
        token = f"sa-token-{uuid.uuid4().hex}"
        uid = self._pod(namespace, pod)["metadata"]["uid"]
        self.tokens[token] = (namespace, account, pod, uid, tuple(audiences))
        return token

