"""The generation core: a query (a prompt, sampling parameters, `n`, `echo`, `logprobs`) in, an
async iterator of `Chunk`s out.

`generate` validates and admits the call before any work (the model's queue places, one per
choice), then returns a `Generation` (`generate_many`: a call's several queries, admitted all or
none): iterate it for one choice's chunks (`ready()` takes those already posted), or `collect()`
every choice, one joined chunk each. What OpenAI's completions ask beyond one generation (choices,
echo, scores and their text offsets) is done here, for every door (query.py). Its deadline is one
timer: when it passes, a generation still waiting is dropped (counted "expired") and the iterator
raises DeadlineExceeded; `cancel()` frees the rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from service.errors import DeadlineExceeded, InvalidArgument, label_model
from service.generation import scoring
from service.generation.handle import GenerationHandle
from service.generation.output import EOS, LENGTH, STOP, Chunk
from service.generation.query import GenerateQuery, Shaper, check_query, choice_params
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

if TYPE_CHECKING:
    from service.generation.model import GenerationModel


class Generation:
    """One admitted query: `async for chunk in generation` (its one choice), `ready()`, `collect()`
    (every choice), `cancel()`."""

    def __init__(self, model, handles: list[GenerationHandle], query: GenerateQuery, deadline: float | None):
        self.model = model.name
        self.interval_s = query.stream_interval_ms / 1e3
        self.n = query.n
        self._handles, self._expire, self._deadline = handles, model.expire, deadline
        self._shaped = query.shaped
        self._shapers: list[Shaper] = []
        if self._shaped:
            prompt_text = _text(model, query.prompt)
            self._shapers = [Shaper(prompt_text, query.echo, query.params.logprobs is not None) for _ in handles]
        self._timer = None
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + (deadline - time.monotonic()), self._expired)

    def _expired(self) -> None:
        error = DeadlineExceeded(
            "the call's deadline passed before the generation finished; allow more time or ask for fewer tokens"
        )
        for handle in self._handles:
            self._expire(handle, error)

    def __aiter__(self):
        """Choice 0's chunks; without echo or logprobs straight from the scheduler's handle (nothing
        added per token)."""
        return self if self._shaped else self._handles[0]

    async def __anext__(self) -> Chunk:
        return self._shapers[0](await self._handles[0].__anext__())

    def ready(self) -> list[Chunk]:
        chunks = self._handles[0].ready()
        return [self._shapers[0](c) for c in chunks] if self._shaped else chunks

    def listen(self, on_post: Callable[[], None]) -> None:
        """Calls `on_post()` on the event loop after each chunk or error the scheduler posts to its
        one choice: for a reader that takes them with `take()` rather than iterating (the engine
        core's streams, service/split/engine.py: no task per generation)."""
        self._handles[0].listen(on_post)

    def take(self) -> tuple[Chunk | None, BaseException | None, bool]:
        """Its one choice's chunks posted so far, joined (None when none), the error posted after
        them (or None), and whether the generation has ended (its last chunk or its error taken)."""
        handle = self._handles[0]
        chunks, error = handle.take()
        if self._shaped:
            chunks = [self._shapers[0](c) for c in chunks]
        return (join_chunks(chunks) if chunks else None), error, handle.ended

    async def batches(self):
        """Its one choice's chunks, those that queued up while the previous one was used joined into one."""
        async for chunk in self:
            yield join_chunks([chunk, *self.ready()])

    async def collect(self) -> list[Chunk]:
        """Every choice, one joined chunk each (n), once all have ended (one wake-up per choice); a
        score-only query's one chunk stands for its n alike choices."""
        if len(self._handles) == 1:
            results = [await self._handles[0].collect()]
        else:
            results = await asyncio.gather(*(handle.collect() for handle in self._handles))
        chunks = [join_chunks(c) for c in results]
        if self._shaped:
            prompt = chunks[0].prompt_logprobs  # choice 0 scored the prompt for every choice
            chunks = [shape(c, prompt) for shape, c in zip(self._shapers, chunks, strict=True)]
        return chunks if len(chunks) == self.n else chunks * self.n

    def cancel(self) -> None:
        """Ends the generation (idempotent): its rows are freed at the scheduler's next step."""
        if self._timer is not None:
            self._timer.cancel()
            if self._deadline is not None and time.monotonic() >= self._deadline:  # the door's deadline fired first
                self._expired()
        for handle in self._handles:
            handle.cancel()


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
        last.cached_tokens,
    )


class GenerationCore:
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    async def generate(self, query: GenerateQuery, deadline: float | None = None) -> Generation:
        """Validates and admits (refusals raise here, before any work and before a door answers 200)."""
        (generation,) = await self.generate_many([query], deadline)
        return generation

    async def generate_many(self, queries: list[GenerateQuery], deadline: float | None = None) -> list[Generation]:
        """Several queries of one model (a call's prompts), admitted all or none: every choice's queue
        place taken at once, a call bigger than the queue refused (INVALID_ARGUMENT). The caller
        cancels every one it got once it is done with them, or when anything fails."""
        if not queries:
            raise InvalidArgument("no generation asked for; send at least one prompt")
        for query in queries:
            check_query(query)
        if len({q.model for q in queries}) > 1:
            raise InvalidArgument("the generations of one call must name one model")
        model = cast("GenerationModel", self.registry.get("generation", queries[0].model))
        label_model(model.name)
        runs = [(q.prompt, choice_params(q, j), q.prompt_name) for q in queries for j in range(q.runs)]
        handles = await model.submit_many(runs)
        try:
            out, at = [], 0
            for q in queries:
                out.append(Generation(model, handles[at : at + q.runs], q, deadline))
                at += q.runs
            return out
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
