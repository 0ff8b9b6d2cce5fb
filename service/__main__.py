"""`python -m service`: run the gRPC service (flags and TS_* variables: service/settings.py).

    python -m service --models models --host 127.0.0.1 --port 50051 --metrics-port 9464

Exits 0 after a graceful SIGTERM / SIGINT shutdown, 1 when it cannot start (the log says why:
a bad model directory, strict provider fallback, a port in use).
"""

from __future__ import annotations

import asyncio
import logging
import sys

from service.manifest import ModelDirError
from service.registry import ModelLoadError
from service.runtime import ProviderError
from service.server import serve
from service.settings import Settings

log = logging.getLogger("service")


def main(argv: list[str] | None = None) -> int:
    settings = Settings.from_args(argv)
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(serve(settings))
    except (ModelDirError, ModelLoadError, ProviderError, OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
