"""The endpoint's TLS: a server certificate reloaded when cert-manager renews it."""

from __future__ import annotations

import logging
import os
import ssl
import time
from typing import Callable

logger = logging.getLogger("ddpjob_operator.progress")


class ServerCertificate:
    """The endpoint's TLS certificate, reloaded when its files change (cert-manager renews a Secret in place;
    the kubelet swaps the mounted files): new connections get the new one, open ones keep theirs."""

    CHECK_SECONDS = 30.0

    def __init__(self, cert_file: str, key_file: str, clock: Callable[[], float] = time.monotonic):
        self.cert_file, self.key_file, self.clock = cert_file, key_file, clock
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._stat()
        self.context.load_cert_chain(cert_file, key_file)
        self._checked = clock()

    def _stat(self) -> tuple[float, ...]:
        return tuple(os.stat(f).st_mtime_ns for f in (self.cert_file, self.key_file))

    def refresh(self, force: bool = False) -> None:
        if not force and self.clock() - self._checked < self.CHECK_SECONDS:
            return
        self._checked = self.clock()
        try:
            stamp = self._stat()
            if force or stamp != self._stamp:
                self.context.load_cert_chain(self.cert_file, self.key_file)
                self._stamp = stamp
                logger.info("progress endpoint: loaded the renewed certificate %s", self.cert_file)
        except (OSError, ssl.SSLError) as exc:  # half-written during a swap: keep the old one, retry later
            logger.warning("progress endpoint: cannot load certificate %s yet: %s", self.cert_file, exc)
