"""A front end's models: what each served model is, told by the engine core (`Served`), with no
session and no weights. An embedding model's stand-in keeps its tokenizer and prompts (its calls
are checked and tokenized here, the engine only batches and computes them). A generation model's
stand-in keeps what the doors and the cores read in the front end: its tokenizer (prompts of chats
are rendered and tokenized here), chat template, tool parser, structured-output compiler (requests
are refused here; the engine compiles again, cached) and its limits. Both take their queue's places
in the engine (`admission` here refuses only a call bigger than the queue, and every call while
draining)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from service import tokenizing
from service.admission import Admission
from service.embedding.prompts import Prompts
from service.engine.tokenization import EmbeddingTokenizer
from service.generation import chat_template
from service.generation.constraint import Constraints
from service.generation.model import GenerationModel
from service.generation.tokens import TokenizerInfo
from service.manifest import load_model_dir
from service.registry import ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.split.wire import Served, Welcome


class RemoteModel:
    """A served model (the registry's Backend) whose compute runs in the engine core."""

    def __init__(self, served: Served, manifest: Any):
        self.name, self.kind, self.manifest = served.name, served.kind, manifest
        self.provider, self.variant = served.provider, served.variant
        self._info = served.info

    @classmethod
    def load(cls, model_dir: Any, settings: Settings, runtime: Runtime) -> RemoteModel:
        raise NotImplementedError("a front end's models come from the engine (service/split/models.py build)")

    async def start(self) -> None:
        """Nothing runs here: the engine started and warmed the model."""

    async def warmup(self) -> None:
        """The engine warmed it up before it said it serves it."""

    async def stop(self) -> None:
        """The engine drains the model's queue."""

    def info(self) -> dict[str, Any]:
        return {**self._info, "manifest": dict(self._info["manifest"])}


class RemoteEmbeddingModel(RemoteModel):
    """An embedding model's front-end half: its tokenizer and prompts (calls are checked and
    tokenized here, service/split/cores.py) and its queue's size (`admission` here refuses only a
    call bigger than the queue, and every call while draining; the engine takes the places)."""

    def __init__(self, served: Served, model_dir: Any, runtime: Runtime):
        super().__init__(served, model_dir.manifest)
        m = model_dir.manifest
        self.tokenizer = EmbeddingTokenizer(model_dir.file(m.tokenizer["file"]), m.max_input_tokens)
        self.prompts = Prompts.of(m)
        self.dimension = int(m.embedding_dim or 0)
        assert served.embedding is not None  # served_models sends it for every embedding model
        capacity = served.embedding["max_queue"]
        self.admission = Admission("embedding", self.name, capacity, "queued inputs", gate=runtime.gate)


class RemoteGenerationModel(RemoteModel):
    """A generation model's front-end half (module doc)."""

    check_ids = GenerationModel.check_ids  # the same refusals, with this model's vocabulary

    def __init__(self, served: Served, model_dir: Any, settings: Settings, runtime: Runtime):
        super().__init__(served, model_dir.manifest)
        g = served.generation or {}
        m = model_dir.manifest
        self.tokenizer = tokenizing.load(model_dir.file(m.tokenizer["file"]))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.text_encoder = tokenizing.Encoder(self.tokenizer)
        self.chat_template = chat_template.for_model(model_dir, settings.chat_templates(), self.tokenizer)
        self.tool_parser = settings.tool_parsers().get(self.name)
        self.context, self.max_prompt, self.max_prompt_chars = g["context"], g["max_prompt"], g["max_prompt_chars"]
        self.tokenizer_info = TokenizerInfo(**g["tokenizer_info"])
        self.vocab_size = self.tokenizer_info.vocab_size
        self.constraints = Constraints(self.tokenizer, g["graph_vocab"], frozenset(g["eos_ids"]))
        admission = Admission("generation", self.name, g["max_queue"], "queued generations", gate=runtime.gate)
        self.scheduler = SimpleNamespace(admission=admission)


def build_registry(welcome: Welcome, settings: Settings, runtime: Runtime) -> ModelRegistry:
    """The front end's registry over the engine's models (their directories read for manifests,
    tokenizers and chat templates only: no graph is opened)."""
    backends: list[Any] = []
    dirs = {}
    for served in welcome.models:
        model_dir = load_model_dir(served.path, verify_hashes=False)
        dirs[served.name] = model_dir.path
        if served.kind == "generation":
            backends.append(RemoteGenerationModel(served, model_dir, settings, runtime))
        elif served.kind == "embedding":
            backends.append(RemoteEmbeddingModel(served, model_dir, runtime))
        else:
            backends.append(RemoteModel(served, model_dir.manifest))
    registry = ModelRegistry(backends, dict(welcome.defaults), dirs, runtime.gate)
    registry.warmed = True
    return registry
