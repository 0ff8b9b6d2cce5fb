"""The generation core: a prompt and sampling parameters in, an async iterator of `Chunk`s out.

`generate` validates and admits the call before any work (the model's queue place), then returns
a `Generation` (`generate_many`: a call's several generations, admitted all or none): iterate it
for chunks (`ready()` takes those already posted, `collect()` waits for all of them at once). Its
deadline is one timer: when it passes, a generation still waiting is dropped (counted "expired")
and the iterator raises DeadlineExceeded; `cancel()` frees the row.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from service.errors import DeadlineExceeded, InvalidArgument, label_model
from service.generation import scoring
from service.generation.decoding import SamplingParams
from service.generation.sequence import EOS, LENGTH, STOP, Chunk, GenerationHandle
from service.generation.tokens import INLINE_TOKENS, TOKENIZE_MAX_CHARS, Detokenized, Tokenized, TokenizerInfo
from service.registry import ModelRegistry
from service.timings import Timings

__all__ = [
    "EOS",
    "LENGTH",
    "STOP",
    "Chunk",
    "Detokenized",
    "GenerateQuery",
    "Generation",
    "GenerationCore",
    "Timings",
    "Tokenized",
    "TokenizerInfo",
    "join_chunks",
]

MAX_STREAM_INTERVAL_MS = 1000

if TYPE_CHECKING:
    from service.generation.model import GenerationModel


@dataclass(frozen=True)
class GenerateQuery:
    prompt: str | list[int]  # text, or token ids taken as they are (no start token added)
    params: SamplingParams
    model: str = ""  # empty: the default generation model
    stream_interval_ms: int = 0  # a stream pauses this long after each message (0: none)
    prompt_name: str = "prompt"  # how a refusal names the prompt (a request's prompt[i])


class Generation:
    """One admitted generation: `async for chunk in generation`, `ready()`, `collect()`, `cancel()`."""

    def __init__(self, model, handle: GenerationHandle, interval_s: float, deadline: float | None, prompt_text: str):
        self.model = model.name
        self.interval_s = interval_s
        self.prompt_text = prompt_text  # the prompt as text (token ids decoded, special tokens left out)
        self._handle, self._expire, self._deadline = handle, model.expire, deadline
        self._timer = None
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + (deadline - time.monotonic()), self._expired)

    def _expired(self) -> None:
        self._expire(
            self._handle,
            DeadlineExceeded(
                "the call's deadline passed before the generation finished; allow more time or ask for fewer tokens"
            ),
        )

    def __aiter__(self) -> GenerationHandle:
        return self._handle  # chunks straight from the scheduler's handle: nothing added per token

    def ready(self) -> list[Chunk]:
        return self._handle.ready()

    async def collect(self) -> list[Chunk]:
        return await self._handle.collect()

    def cancel(self) -> None:
        """Ends the generation (idempotent): its row is freed at the scheduler's next step."""
        if self._timer is not None:
            self._timer.cancel()
            if self._deadline is not None and time.monotonic() >= self._deadline:  # the door's deadline fired first
                self._expired()
        self._handle.cancel()


def join_chunks(chunks: list[Chunk]) -> Chunk:
    """Consecutive chunks of one generation as one (text and tokens joined; the last one's ending)."""
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    return Chunk(
        "".join(c.text for c in chunks),
        [t for c in chunks for t in c.token_ids],
        last.finish_reason,
        last.input_tokens,
        last.output_tokens,
        last.timings,
        scoring.joined([c.logprobs for c in chunks]),
        scoring.joined([c.prompt_logprobs for c in chunks]),
    )


class GenerationCore:
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    async def generate(self, query: GenerateQuery, deadline: float | None = None) -> Generation:
        """Validates and admits (refusals raise here, before any work and before a door answers 200)."""
        (generation,) = await self.generate_many([query], deadline)
        return generation

    async def generate_many(self, queries: list[GenerateQuery], deadline: float | None = None) -> list[Generation]:
        """Several generations of one model (a call's prompts and choices), admitted all or none: their
        queue places taken at once, a call bigger than the queue refused (INVALID_ARGUMENT). The caller
        cancels every one it got once it is done with them, or when anything fails."""
        if not queries:
            raise InvalidArgument("no generation asked for; send at least one prompt")
        for query in queries:
            if query.stream_interval_ms > MAX_STREAM_INTERVAL_MS:
                raise InvalidArgument(
                    f"stream_interval_ms must be at most {MAX_STREAM_INTERVAL_MS} (0 = send tokens as "
                    f"soon as they are ready), got {query.stream_interval_ms}"
                )
        if len({q.model for q in queries}) > 1:
            raise InvalidArgument("the generations of one call must name one model")
        model = cast("GenerationModel", self.registry.get("generation", queries[0].model))
        label_model(model.name)
        handles = await model.submit_many([(q.prompt, q.params, q.prompt_name) for q in queries])
        try:
            return [
                Generation(model, handle, q.stream_interval_ms / 1e3, deadline, _text(model, q.prompt))
                for q, handle in zip(queries, handles, strict=True)
            ]
        except BaseException:
            for handle in handles:
                handle.cancel()
            raise

    def _model(self, name: str) -> GenerationModel:
        """The generation model a tokenizer call names (no queue place: refused only while draining)."""
        self.registry.admit()
        model = cast("GenerationModel", self.registry.get("generation", name))
        label_model(model.name)
        return model

    def tokenizer_info(self, model: str = "") -> TokenizerInfo:
        """The model's tokenizer settings: special tokens, whether a prompt gets a start token, lengths."""
        return self._model(model).tokenizer_info

    async def tokenize(self, text: str, model: str = "", add_special_tokens: bool = True) -> Tokenized:
        """text -> its token ids and their tokenizer strings (with add_special_tokens, the start token a
        prompt gets). A text over TOKENIZE_MAX_CHARS is INVALID_ARGUMENT (a longer one than the context
        is not: vLLM's /tokenize counts any text); long texts tokenize off the event loop (tokenizing.Encoder)."""
        backend = self._model(model)
        if len(text) > TOKENIZE_MAX_CHARS:
            raise InvalidArgument(
                f"prompt is {len(text)} characters; the tokenizer takes at most {TOKENIZE_MAX_CHARS} "
                "characters a call: split the text"
            )
        (encoding,) = await backend.text_encoder.encode([text], add_special_tokens)
        return Tokenized(backend.name, list(encoding.ids), list(encoding.tokens), backend.context)

    async def detokenize(self, ids: list, model: str = "") -> Detokenized:
        """Token ids (checked: INVALID_ARGUMENT naming `tokens`) -> their text, special tokens left out;
        more than INLINE_TOKENS are checked and decoded in a thread (the check is per element)."""
        backend = self._model(model)
        if len(ids) <= INLINE_TOKENS:
            return Detokenized(backend.name, _decode(backend, ids))
        return Detokenized(backend.name, await asyncio.to_thread(_decode, backend, ids))


def _decode(model: GenerationModel, ids: list) -> str:
    if ids:
        model.check_ids(ids, "tokens")
    return model.tokenizer.decode(ids)


def _text(model: GenerationModel, prompt: str | list[int]) -> str:
    return prompt if isinstance(prompt, str) else model.tokenizer.decode(prompt)
