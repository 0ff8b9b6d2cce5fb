"""The kinds table (service/kinds.py) is what the registry, the manifest check and the KServe data
plane read: each kind's row names its graphs, its default-model setting and its OIP adapter."""

from __future__ import annotations

import dataclasses

import pytest

from service.kinds import KINDS, Kind
from service.kserve.adapter import adapter
from service.kserve.parameters import IGNORED
from service.registry import ModelLoadError, _defaults
from service.settings import Settings


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_has_its_setting_and_its_adapter(name):
    kind = KINDS[name]
    assert kind.default_setting in {f.name for f in dataclasses.fields(Settings)}
    oip = adapter(name)
    assert oip.PARAMETERS and not set(oip.PARAMETERS) & set(IGNORED)
    assert callable(oip.outputs) and callable(oip.infer)


def test_a_kind_without_its_setting_fails_at_load_naming_it(monkeypatch):
    monkeypatch.setitem(
        KINDS,
        "speech",
        Kind("speech", "service.speech.model:SpeechModel", ("SpeechService",), ("encoder",), "embed_max_inputs"),
    )
    with pytest.raises(ModelLoadError, match="kind 'speech' has no setting default_speech_model: add that field"):
        _defaults([], Settings.from_env(env={}))
