"""`GenerationModel`: the registry backend for kind "generation" (a GPT-style decoder with KV cache).

`submit_many(prompts)` checks each prompt's parameters and characters (or token ids), takes the
call's queue places at once (admission, before any work), tokenizes (in a thread when long),
checks each prompt's length, caps max_new_tokens to the served context and hands `Sequence`s to the
model's continuous-batching `Scheduler`, all or none; each handle yields `Chunk`s.
The served context is the model's `max_positions`, capped by settings `gen_max_context`; the KV
cache is a buffer of that many positions per row, updated in place (cache.py), its rows from the
process's KV budget (kvbudget.py). Limits are documented in docs/api.md.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tokenizers import Tokenizer

from service import tokenizing
from service.engine.graphio import GraphIO, attention_off_device
from service.errors import InvalidArgument, ServiceError, quote
from service.generation import chat_template
from service.generation.chat_template import ChatTemplate
from service.generation.constraint import Constraints
from service.generation.decoding import ParamError, SamplingParams, check_params
from service.generation.handle import GenerationHandle
from service.generation.kvbudget import KVBudget, kv_bytes
from service.generation.scheduler import Scheduler
from service.generation.sequence import Sequence
from service.generation.speculate import DRIFT_LIMIT, pass_drifts
from service.generation.tokens import tokenizer_info
from service.manifest import Manifest, ModelDir, eos_token_ids
from service.registry import model_info
from service.runtime import CUDA, ProviderError, Runtime
from service.settings import Settings

log = logging.getLogger(__name__)

PREFILL_TOKENS_PER_STEP = 512  # prompt tokens (padding counted) prefilled per scheduler turn
WARMUP_TOKENS = 2


class GenerationModel:
    kind = "generation"

    def __init__(
        self,
        manifest: Manifest,
        session,
        tokenizer: Tokenizer,
        settings: Settings,
        runtime: Runtime,
        variant: str,
        io_binding: bool | None = None,
    ):
        self.name, self.manifest, self.variant = manifest.name, manifest, variant
        self.provider = session.get_providers()[0]
        self.tokenizer, self.settings = tokenizer, settings
        self.io = GraphIO.inspect(session, manifest.architecture)
        special = manifest.special_tokens
        self.eos_id = special.get("eos")
        self.eos_ids = eos_token_ids(manifest)
        self.bos_id = special.get("bos")
        self.model_context = int(manifest.architecture.get("max_positions") or manifest.max_input_tokens)
        self.context = min(self.model_context, settings.gen_max_context or self.model_context)
        self.max_prompt = min(int(manifest.max_input_tokens), self.context - 1)
        self.max_prompt_chars = tokenizing.max_chars(self.max_prompt, tokenizing.chars_per_token(tokenizer))
        self.max_scored_chars = tokenizing.max_chars(self.context - 1, tokenizing.chars_per_token(tokenizer))
        self.text_encoder = tokenizing.Encoder(tokenizer)
        self.tokenizer_info = tokenizer_info(
            self.name, tokenizer, special, self.context, self.max_prompt, self.vocab_size
        )
        self.max_output = min(int(manifest.max_output_tokens or self.context), self.context - 1)
        self.chat_template: ChatTemplate | None = None  # load() reads it (service/generation/chat.py uses it)
        self.tool_parser = settings.tool_parsers().get(self.name)  # None: picked from the template (tools.py)
        self.constraints = Constraints(tokenizer, self.io.vocab_size, self.eos_ids)  # structured output
        self.features = "not checked"  # prefix caching and speculation (check_passes)
        if not self.io.buffer_kv:
            raise ValueError(
                f"model {self.name!r}: its decoder graph has no seqlens_k input (a format-1 model "
                "directory, whose cache is concatenated every step); rebuild it with `make models`"
            )
        if self.context < self.model_context:
            log.info(
                "generation model %s: context %d of its %d positions (gen_max_context)",
                self.name,
                self.context,
                self.model_context,
            )
        if cpu_attention := attention_off_device(self.provider, self.io):
            why = f"model {self.name!r}: {cpu_attention}"
            if settings.strict_provider:
                raise ProviderError(f"{why}; refusing to load it (strict_provider is set): serve its fp16 variant")
            log.warning("%s: its steps run unbound (session.run; inputs and KV copied each step), serve fp16", why)
        self.budget = KVBudget.of(runtime, self.provider == CUDA)
        self.rows = self.budget.plan_rows(self.name, self.io, settings.gen_max_batch, self.context)
        self.kv_bytes = kv_bytes(self.io, self.rows, self.context)
        if io_binding is None:  # bound in place; io_binding=False runs plain session.run
            io_binding = not cpu_attention
        device = ("cuda" if self.provider == "CUDAExecutionProvider" else "cpu") if io_binding else None
        self.scheduler = Scheduler(
            self.name,
            session,
            self.io,
            runtime,
            max_batch=self.rows,
            max_queue=settings.gen_max_queue,
            prefill_tokens=PREFILL_TOKENS_PER_STEP,
            pad_id=int(special.get("pad", 0)),
            device=device,
            context=self.context,
            gate=runtime.gate,
            prefix_cache=settings.gen_prefix_cache,
            speculate=settings.gen_speculate,
        )

    @classmethod
    def load(cls, model_dir: ModelDir, settings: Settings, runtime: Runtime) -> GenerationModel:
        m = model_dir.manifest
        variant = runtime.choose_variant(m, "decoder")
        path = model_dir.file(m.graph("decoder", variant).file)
        session = runtime.create_session(path)
        tokenizer = tokenizing.load(model_dir.file(m.tokenizer["file"]))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        model = cls(m, session, tokenizer, settings, runtime, variant)
        model.check_passes()
        model.chat_template = chat_template.for_model(model_dir, settings.chat_templates(), tokenizer)
        graph_session, why = runtime.create_graph_session(path)  # decode steps only; prefill stays plain
        if graph_session is not None:
            model.scheduler.cache.enable_graphs(graph_session)
        log.info("generation model %s: CUDA graphs %s", model.name, why if graph_session else f"off: {why}")
        log.info(
            "generation model %s: %d layers, %d heads x %d, context %d, kv %s %s, io_binding=%s",
            model.name,
            model.io.n_layers,
            model.io.n_heads,
            model.io.head_dim,
            model.context,
            model.io.kv_dtype.__name__,
            "buffer (in place)",
            model.scheduler.cache.device is not None,
        )
        return model

    def check_passes(self) -> None:
        """At load, on the empty cache: prefix caching and speculation keep greedy tokens only where a
        token's logits do not depend on the kind of pass it is computed in (speculate.pass_drifts);
        each is turned off for this model where they do, and ModelInfo says why."""
        from_prefix, from_steps = pass_drifts(self.scheduler.cache)
        prefix, spec = self.scheduler.prefix, self.scheduler.speculator
        cached = "on" if prefix.enabled else "off (gen_prefix_cache)"
        if prefix.enabled and from_prefix > DRIFT_LIMIT:
            prefix.enabled = False
            cached = f"off (a continued pass differs from a whole prefill by {from_prefix:.3g}; limit {DRIFT_LIMIT:g})"
        speculation = "on" if spec.default else "per request"
        if from_steps > DRIFT_LIMIT:
            spec.allowed = False
            speculation = f"off (a pass differs from decode steps by {from_steps:.3g}; limit {DRIFT_LIMIT:g})"
        self.features = f"prefix cache {cached}; speculation {speculation}"
        log.info("generation model %s (%s): %s", self.name, self.variant, self.features)

    def submit(self, prompt: str, params: SamplingParams) -> GenerationHandle:
        """Queues one generation, the prompt tokenized in the calling thread (warm-up, tests; the
        doors use submit_many); raises InvalidArgument / ResourceExhausted / Unavailable."""
        self._check(prompt, params)
        self.scheduler.admission.take(1)  # nothing awaits until the scheduler's submit
        try:
            return self._queue(self.tokenizer.encode(prompt).ids, params)
        except BaseException:
            self.scheduler.admission.release(1)
            raise

    async def submit_many(self, prompts: list[tuple[str | list[int], SamplingParams, str]]) -> list[GenerationHandle]:
        """Queues one generation per (prompt: text or token ids taken as they are, params, name in
        refusals), all or none: every check first, then every queue place at once (a call bigger
        than the queue is INVALID_ARGUMENT: admission.py), then the texts tokenized together
        (off the event loop when long); on any failure the places are given back and the
        generations already queued cancelled."""
        for prompt, params, name in prompts:
            self._check(prompt, params, name)
        self.scheduler.admission.take(len(prompts))
        handles: list[GenerationHandle] = []
        try:
            texts = [p for p, _, _ in prompts if isinstance(p, str)]
            encoded = iter(await self.text_encoder.encode(texts) if texts else [])
            for prompt, params, name in prompts:
                ids = list(prompt) if isinstance(prompt, list) else next(encoded).ids
                handles.append(self._queue(ids, params, name))
        except BaseException:
            self.scheduler.admission.release(len(prompts) - len(handles))
            for handle in handles:
                handle.cancel()
            raise
        return handles

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold: those both the graph and the tokenizer know."""
        return min(self.io.vocab_size, self.tokenizer.get_vocab_size(with_added_tokens=True))

    def check_ids(self, ids: list, name: str = "prompt") -> None:
        """InvalidArgument naming `name` unless ids is a non-empty list of this model's token ids
        (integers: JSON doors pass their arrays unchecked)."""
        if not isinstance(ids, list) or not ids:
            raise InvalidArgument(f"{name} is not a non-empty list of token ids; send at least one token")
        vocab = self.vocab_size
        bad = next((i for i, t in enumerate(ids) if type(t) is not int or not 0 <= t < vocab), None)
        if bad is not None:
            shown = ids[bad] if type(ids[bad]) is int else quote(repr(ids[bad]))
            raise InvalidArgument(
                f"{name}[{bad}]={shown} is not a token id of model {self.name!r} "
                f"(its vocabulary is ids 0 to {vocab - 1})"
            )

    def _check(self, prompt: str | list[int], params: SamplingParams, name: str = "prompt") -> None:
        """Every check that comes before a queue place and tokenizing: the parameters, and the
        prompt's characters (a text) or its ids (token ids)."""
        try:
            check_params(params)
        except ParamError as e:
            raise InvalidArgument(str(e)) from e
        bad = next((t for t, _ in params.logit_bias if t >= self.vocab_size), None)
        if bad is not None:
            raise InvalidArgument(
                f"logit_bias names token {bad}; model {self.name!r} has ids 0 to {self.vocab_size - 1}"
            )
        if isinstance(prompt, list):
            self._check_length(len(prompt), params, name)  # before each id is looked at
            self.check_ids(prompt, name)
        else:
            tokens, chars = self._prompt_limit(params)
            tokenizing.check_chars(prompt, chars, name, self.name, tokens, "shorten the prompt")

    def _prompt_limit(self, params: SamplingParams) -> tuple[int, int | None]:
        """(tokens, characters or None: no bound) a prompt may hold: max_prompt, or for a prompt to score
        (prompt_logprobs) the served context minus one token: lm-eval's windows fill the context."""
        if params.prompt_logprobs is None:
            return self.max_prompt, self.max_prompt_chars
        return self.context - 1, self.max_scored_chars

    def _check_length(self, tokens: int, params: SamplingParams, name: str) -> None:
        limit, _ = self._prompt_limit(params)
        if tokens > limit:
            capped = (
                f"; its context is capped at {self.context} tokens by gen_max_context"
                if self.context < self.model_context
                else ""
            )
            raise InvalidArgument(
                f"{name} is {tokens} tokens; model {self.name!r} accepts at most "
                f"{limit} prompt tokens (shorten the prompt{capped})"
            )

    def _queue(self, ids: list[int], params: SamplingParams, name: str = "prompt") -> GenerationHandle:
        if not ids:
            if self.bos_id is None:
                raise InvalidArgument(f"{name} is empty and the model has no start token; send some text")
            ids = [int(self.bos_id)]
        self._check_length(len(ids), params, name)
        wanted = 0 if params.score_only else params.max_new_tokens or self.settings.gen_default_max_new_tokens
        limit = min(self.max_output, self.context - len(ids))
        params = dataclasses.replace(params, max_new_tokens=min(wanted, limit))
        seq = Sequence(ids, params, self.eos_ids, self.tokenizer)
        return self.scheduler.submit(seq)

    def expire(self, handle: GenerationHandle, error: ServiceError) -> None:
        """The generation's deadline passed: it ends with `error` (dropped uncomputed when still queued)."""
        self.scheduler.expire(handle.sequence, error)

    async def start(self) -> None:
        self.scheduler.start()

    async def warmup(self) -> None:
        """A real prefill + decode step through the scheduler; raises on failure."""
        handle = self.submit("Hello", SamplingParams(max_new_tokens=WARMUP_TOKENS))
        async for _ in handle:
            pass

    async def stop(self) -> None:
        await self.scheduler.stop(self.settings.grace_seconds)
        self.budget.give_back(self.kv_bytes)
        self.kv_bytes = 0

    def info(self) -> dict[str, Any]:
        info = model_info(self, self.io.vocab_size)
        info["max_input_tokens"], info["max_output_tokens"] = self.max_prompt, self.max_output
        info["manifest"].update(
            {
                "serving.context": str(self.context),
                "serving.kv_rows": str(self.rows),
                "serving.kv_cache_bytes": str(self.kv_bytes),
                "serving.prefix_speculation": self.features,
            }
        )
        return info
