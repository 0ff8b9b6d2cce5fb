"""A front end of `--frontends N`: the ordinary server (service/server.py: every door, on ports
shared through SO_REUSEPORT) over cores that forward compute to the engine core
(service/split/cores.py), its models described by the engine (service/split/models.py).

`connect` waits for the first engine's Welcome (the engines are up before the supervisor starts a
front end; a front end started while they restart waits up to CONNECT_TIMEOUT_S); calls then go to
whichever engine is up and least busy (service/split/client.py `Engines`). The process itself is
service/worker.py `frontend_main`: a `--workers` worker's life over these cores.
"""

from __future__ import annotations

from service.cores import Cores
from service.registry import ModelLoadError, ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.split.client import Engines
from service.split.cores import remote_cores
from service.split.models import build_registry

CONNECT_TIMEOUT_S = 60.0


async def connect(
    settings: Settings, runtime: Runtime, endpoints: tuple[str, ...]
) -> tuple[Engines, ModelRegistry, Cores]:
    client = Engines(endpoints)
    try:
        welcome = await client.connected(CONNECT_TIMEOUT_S)
        registry = build_registry(welcome, settings, runtime)
    except TimeoutError:
        client.close()
        raise ModelLoadError(
            f"no engine core answered on {', '.join(endpoints)} within {CONNECT_TIMEOUT_S:g} s"
        ) from None
    except BaseException:
        client.close()
        raise
    return client, registry, remote_cores(registry, settings, runtime, client)
