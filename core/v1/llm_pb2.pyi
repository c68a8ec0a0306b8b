from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "prompt_token_ids", "max_tokens", "temperature", "top_p", "seed", "ignore_eos", "stop", "request_id", "model")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    ignore_eos: bool
    stop: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    model: str
    def __init__(self, prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., stop: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "usage", "request_id", "model")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: Usage
    request_id: str
    model: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., request_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "usage", "request_id", "index", "emit_ms", "fwd_ms")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EMIT_MS_FIELD_NUMBER: _ClassVar[int]
    FWD_MS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: Usage
    request_id: str
    index: int
    emit_ms: float
    fwd_ms: float
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., request_id: _Optional[str] = ..., index: _Optional[int] = ..., emit_ms: _Optional[float] = ..., fwd_ms: _Optional[float] = ...) -> None: ...
