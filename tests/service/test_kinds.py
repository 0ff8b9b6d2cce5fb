"""The kinds table (service/kinds.py) is what the registry, the manifest check and the server's health
read; each kind's code is wired by plain imports: its backend class (service/cores.py `BACKENDS`),
its KServe adapter (service/kserve/dataplane.py `ADAPTERS`) and its default-model setting."""

from __future__ import annotations

import dataclasses

import pytest

from service.cores import BACKENDS
from service.kinds import KINDS, Kind
from service.kserve.dataplane import ADAPTERS
from service.kserve.parameters import IGNORED
from service.registry import ModelLoadError, ModelRegistry, _defaults
from service.runtime import Runtime
from service.settings import Settings


def test_every_kind_has_its_backend_and_its_adapter_and_nothing_else_has():
    assert set(BACKENDS) == set(KINDS) == set(ADAPTERS)


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_has_its_setting_and_its_adapter(name):
    kind = KINDS[name]
    assert kind.default_setting in {f.name for f in dataclasses.fields(Settings)}
    oip = ADAPTERS[name]
    assert oip.PARAMETERS and not set(oip.PARAMETERS) & set(IGNORED)
    assert callable(oip.outputs) and callable(oip.infer)


def test_a_kind_without_its_setting_fails_at_load_naming_it(monkeypatch):
    monkeypatch.setitem(KINDS, "speech", Kind("speech", ("SpeechService",), ("encoder",), "embed_max_inputs"))
    with pytest.raises(ModelLoadError, match="kind 'speech' has no setting default_speech_model: add that field"):
        _defaults([], Settings.from_env(env={}))


def test_a_kind_without_its_backend_fails_at_load_naming_it(embed_models_root):
    settings = Settings.from_env(env={}, models=str(embed_models_root))
    runtime = Runtime(settings)
    try:
        backends = {k: v for k, v in BACKENDS.items() if k != "embedding"}
        with pytest.raises(ModelLoadError, match="no backend for kind 'embedding'"):
            ModelRegistry.load(settings, runtime, backends)
    finally:
        runtime.close()
