"""A front end of `--frontends N`: the ordinary server (service/server.py: every door, on ports
shared through SO_REUSEPORT) over cores that forward compute to the engine core
(service/split/cores.py), its models described by the engine (service/split/models.py).

`connect` waits for the engine's Welcome (it is up before the supervisor starts a front end; a
front end started while it restarts waits up to CONNECT_TIMEOUT_S). The process itself is
service/worker.py `frontend_main`: a `--workers` worker's life over these cores.
"""

from __future__ import annotations

from service.cores import Cores
from service.registry import ModelLoadError, ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.split.client import EngineClient
from service.split.cores import remote_cores
from service.split.models import build_registry

CONNECT_TIMEOUT_S = 60.0


async def connect(settings: Settings, runtime: Runtime, endpoint: str) -> tuple[EngineClient, ModelRegistry, Cores]:
    client = EngineClient(endpoint)
    try:
        welcome = await client.connected(CONNECT_TIMEOUT_S)
        registry = build_registry(welcome, settings, runtime)
    except TimeoutError:
        client.close()
        raise ModelLoadError(f"no engine core answered on {endpoint} within {CONNECT_TIMEOUT_S:g} s") from None
    except BaseException:
        client.close()
        raise
    return client, registry, remote_cores(registry, settings, runtime, client)
