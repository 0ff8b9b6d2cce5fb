from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EmbeddingEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EMBEDDING_ENCODING_UNSPECIFIED: _ClassVar[EmbeddingEncoding]
    EMBEDDING_ENCODING_FLOAT: _ClassVar[EmbeddingEncoding]
    EMBEDDING_ENCODING_PACKED_FLOAT32: _ClassVar[EmbeddingEncoding]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP_SEQUENCE: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]

class AttentionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTENTION_KIND_UNSPECIFIED: _ClassVar[AttentionKind]
    SELF: _ClassVar[AttentionKind]
    CAUSAL: _ClassVar[AttentionKind]
    CROSS: _ClassVar[AttentionKind]
EMBEDDING_ENCODING_UNSPECIFIED: EmbeddingEncoding
EMBEDDING_ENCODING_FLOAT: EmbeddingEncoding
EMBEDDING_ENCODING_PACKED_FLOAT32: EmbeddingEncoding
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP_SEQUENCE: FinishReason
FINISH_REASON_EOS: FinishReason
ATTENTION_KIND_UNSPECIFIED: AttentionKind
SELF: AttentionKind
CAUSAL: AttentionKind
CROSS: AttentionKind

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "cached_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("tokenize_ms", "queue_ms", "inference_ms", "total_ms", "time_to_first_token_ms")
    TOKENIZE_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    tokenize_ms: float
    queue_ms: float
    inference_ms: float
    total_ms: float
    time_to_first_token_ms: float
    def __init__(self, tokenize_ms: _Optional[float] = ..., queue_ms: _Optional[float] = ..., inference_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("inputs", "model", "normalize", "truncate", "dimensions", "request_id", "encoding", "prompt_name", "prompt")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    normalize: bool
    truncate: bool
    dimensions: int
    request_id: str
    encoding: EmbeddingEncoding
    prompt_name: str
    prompt: str
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., normalize: _Optional[bool] = ..., truncate: _Optional[bool] = ..., dimensions: _Optional[int] = ..., request_id: _Optional[str] = ..., encoding: _Optional[_Union[EmbeddingEncoding, str]] = ..., prompt_name: _Optional[str] = ..., prompt: _Optional[str] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values", "packed")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    packed: bytes
    def __init__(self, values: _Optional[_Iterable[float]] = ..., packed: _Optional[bytes] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "model", "usage", "timings", "request_id")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    model: str
    usage: Usage
    timings: Timings
    request_id: str
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "model", "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "stop", "seed", "stream_interval_ms", "prompt_token_ids", "n", "logprobs", "echo", "presence_penalty", "frequency_penalty", "min_p", "logit_bias", "response_format_json", "structured_outputs_json", "speculative")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ECHO_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_JSON_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUTS_JSON_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    model: str
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    stream_interval_ms: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    n: int
    logprobs: int
    echo: bool
    presence_penalty: float
    frequency_penalty: float
    min_p: float
    logit_bias: _containers.ScalarMap[int, float]
    response_format_json: str
    structured_outputs_json: str
    speculative: bool
    def __init__(self, prompt: _Optional[str] = ..., model: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., stream_interval_ms: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., n: _Optional[int] = ..., logprobs: _Optional[int] = ..., echo: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., response_format_json: _Optional[str] = ..., structured_outputs_json: _Optional[str] = ..., speculative: _Optional[bool] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top", "text_offset")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    TEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    text_offset: int
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ..., text_offset: _Optional[int] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class GenerateChoice(_message.Message):
    __slots__ = ("index", "text", "token_ids", "finish_reason", "logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "usage", "timings", "model", "logprobs", "choices")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    model: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    choices: _containers.RepeatedCompositeFieldContainer[GenerateChoice]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., model: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., choices: _Optional[_Iterable[_Union[GenerateChoice, _Mapping]]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "usage", "timings", "model", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    model: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., model: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    reasoning_content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., reasoning_content: _Optional[str] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("messages", "model", "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "stop", "seed", "n", "tools_json", "chat_template_kwargs_json", "continue_final_message", "response_format_json", "structured_outputs_json", "tool_choice_json", "parallel_tool_calls", "presence_penalty", "frequency_penalty", "min_p", "logit_bias", "speculative")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_JSON_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUTS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_JSON_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    model: str
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    n: int
    tools_json: str
    chat_template_kwargs_json: str
    continue_final_message: bool
    response_format_json: str
    structured_outputs_json: str
    tool_choice_json: str
    parallel_tool_calls: bool
    presence_penalty: float
    frequency_penalty: float
    min_p: float
    logit_bias: _containers.ScalarMap[int, float]
    speculative: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., model: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., n: _Optional[int] = ..., tools_json: _Optional[str] = ..., chat_template_kwargs_json: _Optional[str] = ..., continue_final_message: _Optional[bool] = ..., response_format_json: _Optional[str] = ..., structured_outputs_json: _Optional[str] = ..., tool_choice_json: _Optional[str] = ..., parallel_tool_calls: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., speculative: _Optional[bool] = ...) -> None: ...

class ChatChoice(_message.Message):
    __slots__ = ("index", "content", "token_ids", "finish_reason", "reasoning_content", "tool_calls")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    index: int
    content: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    reasoning_content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, index: _Optional[int] = ..., content: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., reasoning_content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class ChatResponse(_message.Message):
    __slots__ = ("choices", "usage", "model")
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedCompositeFieldContainer[ChatChoice]
    usage: Usage
    model: str
    def __init__(self, choices: _Optional[_Iterable[_Union[ChatChoice, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class ChatChunk(_message.Message):
    __slots__ = ("content", "token_ids", "finish_reason", "usage", "model", "reasoning_content", "tool_calls")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    content: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    model: str
    reasoning_content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, content: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., model: _Optional[str] = ..., reasoning_content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class TranslateRequest(_message.Message):
    __slots__ = ("inputs", "model", "beam_size", "max_length", "length_penalty")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    beam_size: int
    max_length: int
    length_penalty: float
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., beam_size: _Optional[int] = ..., max_length: _Optional[int] = ..., length_penalty: _Optional[float] = ...) -> None: ...

class Translation(_message.Message):
    __slots__ = ("text", "score")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    text: str
    score: float
    def __init__(self, text: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class TranslateResponse(_message.Message):
    __slots__ = ("translations", "model", "usage", "timings")
    TRANSLATIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    translations: _containers.RepeatedCompositeFieldContainer[Translation]
    model: str
    usage: Usage
    timings: Timings
    def __init__(self, translations: _Optional[_Iterable[_Union[Translation, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class FillMaskRequest(_message.Message):
    __slots__ = ("inputs", "model", "top_k")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    top_k: int
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., top_k: _Optional[int] = ...) -> None: ...

class MaskCandidate(_message.Message):
    __slots__ = ("token", "token_id", "score", "sequence")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    token: str
    token_id: int
    score: float
    sequence: str
    def __init__(self, token: _Optional[str] = ..., token_id: _Optional[int] = ..., score: _Optional[float] = ..., sequence: _Optional[str] = ...) -> None: ...

class MaskPrediction(_message.Message):
    __slots__ = ("candidates",)
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[MaskCandidate]
    def __init__(self, candidates: _Optional[_Iterable[_Union[MaskCandidate, _Mapping]]] = ...) -> None: ...

class FilledInput(_message.Message):
    __slots__ = ("masks",)
    MASKS_FIELD_NUMBER: _ClassVar[int]
    masks: _containers.RepeatedCompositeFieldContainer[MaskPrediction]
    def __init__(self, masks: _Optional[_Iterable[_Union[MaskPrediction, _Mapping]]] = ...) -> None: ...

class FillMaskResponse(_message.Message):
    __slots__ = ("results", "model", "usage", "timings")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[FilledInput]
    model: str
    usage: Usage
    timings: Timings
    def __init__(self, results: _Optional[_Iterable[_Union[FilledInput, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class EmbedSparseRequest(_message.Message):
    __slots__ = ("inputs", "model", "truncate", "prompt_name", "prompt", "request_id")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    truncate: bool
    prompt_name: str
    prompt: str
    request_id: str
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., truncate: _Optional[bool] = ..., prompt_name: _Optional[str] = ..., prompt: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SparseEmbedding(_message.Message):
    __slots__ = ("indices", "values")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedSparseResponse(_message.Message):
    __slots__ = ("embeddings", "model", "usage", "timings", "request_id")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[SparseEmbedding]
    model: str
    usage: Usage
    timings: Timings
    request_id: str
    def __init__(self, embeddings: _Optional[_Iterable[_Union[SparseEmbedding, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("query", "documents", "model", "top_n", "raw_scores", "truncate", "return_documents", "request_id")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    RETURN_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    query: str
    documents: _containers.RepeatedScalarFieldContainer[str]
    model: str
    top_n: int
    raw_scores: bool
    truncate: bool
    return_documents: bool
    request_id: str
    def __init__(self, query: _Optional[str] = ..., documents: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., top_n: _Optional[int] = ..., raw_scores: _Optional[bool] = ..., truncate: _Optional[bool] = ..., return_documents: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class RerankResult(_message.Message):
    __slots__ = ("index", "score", "document")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    document: str
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ..., document: _Optional[str] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("results", "model", "usage", "timings", "request_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RerankResult]
    model: str
    usage: Usage
    timings: Timings
    request_id: str
    def __init__(self, results: _Optional[_Iterable[_Union[RerankResult, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClassifyInput(_message.Message):
    __slots__ = ("text", "text_pair")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_PAIR_FIELD_NUMBER: _ClassVar[int]
    text: str
    text_pair: str
    def __init__(self, text: _Optional[str] = ..., text_pair: _Optional[str] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("inputs", "model", "raw_scores", "truncate", "request_id")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[ClassifyInput]
    model: str
    raw_scores: bool
    truncate: bool
    request_id: str
    def __init__(self, inputs: _Optional[_Iterable[_Union[ClassifyInput, _Mapping]]] = ..., model: _Optional[str] = ..., raw_scores: _Optional[bool] = ..., truncate: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "score", "label_id")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    LABEL_ID_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    label_id: int
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ..., label_id: _Optional[int] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelScore]
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("results", "model", "usage", "timings", "request_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Classification]
    model: str
    usage: Usage
    timings: Timings
    request_id: str
    def __init__(self, results: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "kind", "execution_provider", "max_input_tokens", "embedding_dimension", "vocab_size", "is_default", "variant", "manifest", "max_output_tokens")
    class ManifestEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    execution_provider: str
    max_input_tokens: int
    embedding_dimension: int
    vocab_size: int
    is_default: bool
    variant: str
    manifest: _containers.ScalarMap[str, str]
    max_output_tokens: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., execution_provider: _Optional[str] = ..., max_input_tokens: _Optional[int] = ..., embedding_dimension: _Optional[int] = ..., vocab_size: _Optional[int] = ..., is_default: _Optional[bool] = ..., variant: _Optional[str] = ..., manifest: _Optional[_Mapping[str, str]] = ..., max_output_tokens: _Optional[int] = ...) -> None: ...

class AttentionRequest(_message.Message):
    __slots__ = ("model", "text", "target", "layers", "heads")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    target: str
    layers: _containers.RepeatedScalarFieldContainer[int]
    heads: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., target: _Optional[str] = ..., layers: _Optional[_Iterable[int]] = ..., heads: _Optional[_Iterable[int]] = ...) -> None: ...

class AttentionMap(_message.Message):
    __slots__ = ("kind", "layer", "head", "rows", "cols", "weights", "stats")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    kind: AttentionKind
    layer: int
    head: int
    rows: int
    cols: int
    weights: _containers.RepeatedScalarFieldContainer[float]
    stats: HeadStats
    def __init__(self, kind: _Optional[_Union[AttentionKind, str]] = ..., layer: _Optional[int] = ..., head: _Optional[int] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., weights: _Optional[_Iterable[float]] = ..., stats: _Optional[_Union[HeadStats, _Mapping]] = ...) -> None: ...

class HeadStats(_message.Message):
    __slots__ = ("entropy", "mean_distance", "to_special", "to_previous", "to_self")
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    MEAN_DISTANCE_FIELD_NUMBER: _ClassVar[int]
    TO_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    TO_PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    TO_SELF_FIELD_NUMBER: _ClassVar[int]
    entropy: float
    mean_distance: float
    to_special: float
    to_previous: float
    to_self: float
    def __init__(self, entropy: _Optional[float] = ..., mean_distance: _Optional[float] = ..., to_special: _Optional[float] = ..., to_previous: _Optional[float] = ..., to_self: _Optional[float] = ...) -> None: ...

class AttentionResponse(_message.Message):
    __slots__ = ("model", "source_tokens", "target_tokens", "maps", "usage", "timings", "kind", "target")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAPS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    model: str
    source_tokens: _containers.RepeatedScalarFieldContainer[str]
    target_tokens: _containers.RepeatedScalarFieldContainer[str]
    maps: _containers.RepeatedCompositeFieldContainer[AttentionMap]
    usage: Usage
    timings: Timings
    kind: str
    target: str
    def __init__(self, model: _Optional[str] = ..., source_tokens: _Optional[_Iterable[str]] = ..., target_tokens: _Optional[_Iterable[str]] = ..., maps: _Optional[_Iterable[_Union[AttentionMap, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., kind: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...
