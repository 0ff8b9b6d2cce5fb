"""Signals of a serving process, handled from the first moment of `serve` (service/server.py).

SIGTERM / SIGINT start the graceful drain (a second one does not restart it); one that comes while
the models load or warm up is remembered and the drain starts as soon as the server exists, so the
process still exits 0 through the drain instead of dying half-loaded. SIGHUP re-reads the bearer
tokens file (rotation); during the start it is applied once the server exists (the file was read
before the load). SIGUSR1 / SIGUSR2, whose default action ends a process at once, are logged and
ignored: a stray signal must not end a server without its drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Protocol

from service.auth import Tokens

log = logging.getLogger(__name__)

STOP = (signal.SIGTERM, signal.SIGINT)
IGNORED = (signal.SIGUSR1, signal.SIGUSR2)


class Drainable(Protocol):
    """What a signal acts on: service/server.py's Server (named here without importing the server)."""

    tokens: Tokens

    def shutdown(self) -> object: ...


class Signals:
    """Installed on the running loop at construction; `attach(server)` once the server has started."""

    def __init__(self) -> None:
        self.server: Drainable | None = None
        self.stop_requested = self.hangup = False
        loop = asyncio.get_running_loop()
        for sig in STOP:
            loop.add_signal_handler(sig, self._on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
        for sig in IGNORED:
            loop.add_signal_handler(sig, self._on_ignored, sig)

    def attach(self, server: Drainable) -> None:
        """The server exists: a stop or a SIGHUP that came while it started takes effect now."""
        self.server = server
        if self.hangup:
            self._reload_tokens()
        if self.stop_requested:
            server.shutdown()

    def _on_stop(self, sig: signal.Signals) -> None:
        if self.server is None:
            log.info("received %s while starting; draining once the models are up", sig.name)
            self.stop_requested = True
            return
        log.info("received %s", sig.name)
        self.server.shutdown()

    def _on_hangup(self) -> None:
        if self.server is None:
            log.info("received SIGHUP while starting; the tokens file is read again once the models are up")
            self.hangup = True
            return
        self._reload_tokens()

    def _reload_tokens(self) -> None:
        """Re-reads the tokens file; on failure keeps the tokens in use."""
        assert self.server is not None
        try:
            self.server.tokens.reload()
        except (OSError, ValueError) as e:
            log.error("SIGHUP: cannot re-read the tokens file, keeping the current tokens: %s", e)

    @staticmethod
    def _on_ignored(sig: signal.Signals) -> None:
        log.warning("received %s; ignored (SIGTERM drains the server)", sig.name)
