"""Structured output with llguidance: a row's tokens held to a JSON schema, a regex, a choice or a Lark grammar.

`Constraints.compile(structure)` turns a request's structure into an llguidance matcher off the
event loop (compiling can take a while), bounded in time, cached by the structure's hash (at most
CACHE_SIZE per model). A grammar llguidance refuses is INVALID_ARGUMENT naming the field and its
reason. The compiled matcher rides in `SamplingParams.constraint`; each row takes its own copy
(`RowConstraint`), whose mask, sized to the model's logits (the graph's vocabulary may be padded
past the tokenizer's), removes the disallowed tokens of that row alone before sampling
(service/generation/sampler.py), so its neighbours' tokens do not change. JSON is compact (no
whitespace between tokens, as OpenAI's structured outputs write it): with free whitespace a model
sampling at temperature 1 can spend its whole length on new lines. A row whose grammar is complete
ends (finish "stop").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
from tokenizers import Tokenizer

from service.errors import InvalidArgument

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
COMPACT: JsonCompileOptions = {"item_separator": ",", "key_separator": ":", "whitespace_flexible": False}
CACHE_SIZE = 64
COMPILE_TIMEOUT_S = 10.0
MAX_SPEC_CHARS = 65536


@dataclass(frozen=True)
class Structure:
    """What a request asks its output to match; `field` names it in refusals."""

    kind: str  # one of KINDS
    spec: Any  # a schema (dict), a regex or grammar (str), choices (list of str); None for json_object
    field: str


@dataclass(frozen=True)
class Compiled:
    """A compiled structure: the matcher each row copies, and the mask's width (the logits')."""

    matcher: Any  # llguidance.LLMatcher in its start state
    width: int
    eos: tuple[int, ...]
    structure: Structure | None = field(default=None, compare=False)  # what it was compiled from (service/split/)


class RowConstraint:
    """One row's matcher: `allowed()` before sampling, `accept(token)` after (-> whether it is done)."""

    def __init__(self, compiled: Compiled):
        self.matcher, self.width, self.eos = compiled.matcher.deep_copy(), compiled.width, compiled.eos

    def allowed(self) -> np.ndarray:
        """(width,) bool: the tokens the grammar allows next (the end tokens once it is done or broken)."""
        if self.matcher.is_error() or self.matcher.is_stopped():
            mask = np.zeros(self.width, bool)
            mask[list(self.eos)] = True
            return mask
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), np.uint8), bitorder="little")
        mask = np.zeros(self.width, bool)
        n = min(self.width, bits.size)
        mask[:n] = bits[:n].astype(bool)
        return mask

    def accept(self, token: int) -> bool:
        self.matcher.consume_token(token)
        return self.matcher.is_stopped()


class Constraints:
    """A generation model's compiled structures (service/generation/model.py creates it)."""

    def __init__(self, tokenizer: Tokenizer, width: int, eos: frozenset[int]):
        self._json, self.width, self.eos = tokenizer.to_str(), width, tuple(sorted(eos))
        self._lltokenizer: Any = None
        self._cache: OrderedDict[str, Compiled] = OrderedDict()

    async def compile(self, structure: Structure) -> Compiled:
        key = hashlib.sha256(json.dumps([structure.kind, structure.spec], sort_keys=True).encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        try:
            compiled = await asyncio.wait_for(asyncio.to_thread(self._compile, structure), COMPILE_TIMEOUT_S)
        except TimeoutError as e:
            raise InvalidArgument(
                f"{structure.field}: compiling it took over {COMPILE_TIMEOUT_S:g} s; simplify it"
            ) from e
        self._cache[key] = compiled
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def _compile(self, structure: Structure) -> Compiled:
        if self._lltokenizer is None:
            self._lltokenizer = llguidance.LLTokenizer(self._json, n_vocab=self.width, eos_token=list(self.eos))
        grammar = _grammar(structure)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._lltokenizer)
        if error:
            raise InvalidArgument(f"{structure.field} cannot be used: {error[:300]}")
        matcher = llguidance.LLMatcher(self._lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidArgument(f"{structure.field} cannot be used: {matcher.get_error()[:300]}")
        return Compiled(matcher, self.width, self.eos, structure)


def _grammar(s: Structure) -> str:
    """The structure as an llguidance grammar (InvalidArgument naming the field when malformed)."""
    if len(json.dumps(s.spec)) > MAX_SPEC_CHARS:
        raise InvalidArgument(f"{s.field} is over {MAX_SPEC_CHARS} characters")
    try:
        if s.kind in ("json_schema", "json_object"):
            schema = s.spec if s.kind == "json_schema" else {"type": "object"}
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)
        if s.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(s.spec)
        if s.kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(s.spec))
        return llguidance.LLMatcher.grammar_from_lark(s.spec)
    except (ValueError, TypeError, RuntimeError) as e:
        raise InvalidArgument(f"{s.field} cannot be used: {str(e)[:300]}") from e


def structure_of(body: dict) -> Structure | None:
    """OpenAI's `response_format` (json_object, json_schema) or vLLM's `structured_outputs` (json,
    regex, choice, grammar), checked; None when the request has neither (or response_format text)."""
    fmt, extra = body.get("response_format"), body.get("structured_outputs")
    if fmt is not None and extra is not None:
        raise InvalidArgument("send response_format or structured_outputs, not both")
    if extra is not None:
        return _structured_outputs(extra)
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Structure("json_object", None, "response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidArgument("response_format.json_schema.schema must be a JSON schema (an object)")
        return Structure("json_schema", schema, "response_format.json_schema.schema")
    raise InvalidArgument("response_format.type must be text, json_object or json_schema")


def _structured_outputs(extra: Any) -> Structure:
    given = [k for k in ("json", "regex", "choice", "grammar") if isinstance(extra, dict) and extra.get(k) is not None]
    if len(given) != 1:
        raise InvalidArgument("structured_outputs takes exactly one of json, regex, choice, grammar")
    name, value = given[0], extra[given[0]]
    field = f"structured_outputs.{name}"
    if name == "json":
        try:
            value = json.loads(value) if isinstance(value, str) else value
        except ValueError as e:
            raise InvalidArgument(f"{field} is not JSON ({e})") from e
        if not isinstance(value, dict):
            raise InvalidArgument(f"{field} must be a JSON schema (an object)")
        return Structure("json_schema", value, field)
    if name == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise InvalidArgument(f"{field} must be a non-empty array of strings")
        return Structure("choice", value, field)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{field} must be a non-empty string")
    return Structure(name, value, field)
