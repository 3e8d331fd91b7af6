"""The OpenAI-compatible wire: request and response bodies of `/v1/completions`,
`/v1/chat/completions` and `/v1/models`, as the OpenAI API and vLLM define them.

Fields the server does not implement (log probabilities, echo, penalties, tools, guided
decoding, vLLM's token and detokenizing options, ...) are refused with a 400 naming the field
(`param`) when set to anything but their neutral value, rather than ignored; fields neither
OpenAI nor vLLM define are ignored, as vLLM does, so that newer clients keep working.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

# The longest request body the server reads (`--max-body-bytes`), 4 MiB: a whole 128k-token
# context fits, as JSON token ids (at most 7 bytes per id) or as text (about 4 characters per
# token), with a batch of prompts beside it; a 20 MB body, which only an attacker sends, does not.
DEFAULT_MAX_BODY_BYTES = 4 << 20

# Fields the server does not implement -> their neutral values, the only ones accepted.
_UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
    # vLLM's extensions that change the output or what the response carries.
    "use_beam_search": (None, False),
    "length_penalty": (None, 1),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
    "allowed_token_ids": (None, []),
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
    "logits_processors": (None, []),
    "return_tokens_as_token_ids": (None, False),
    "return_token_ids": (None, False),
    "prompt_embeds": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "vllm_xargs": (None, {}),
}

# Per endpoint, where the neutral value differs (vLLM's defaults).
_UNSUPPORTED_COMPLETION: dict[str, tuple[object, ...]] = {"add_special_tokens": (None, True)}
_UNSUPPORTED_CHAT: dict[str, tuple[object, ...]] = {
    "add_special_tokens": (None, False),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "documents": (None, []),
    "audio": (None,),
    "modalities": (None, ["text"]),
}


def _neutral(value: object, neutral: tuple[object, ...]) -> bool:
    # bool is an int to ==: True must not pass for 1, nor False for 0.
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral)


def refusal(name: str, message: str, value: object) -> ValidationError:
    """A validation error located at the field ``name``, so that the 400 names it as `param`."""
    error = PydanticCustomError("unsupported", message)
    return ValidationError.from_exception_data(
        "request", [InitErrorDetails(type=error, loc=(name,), input=value)]
    )


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    _unsupported: ClassVar[dict[str, tuple[object, ...]]] = {}

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> Self:
        extra = self.model_extra or {}
        for name, neutral in {**_UNSUPPORTED, **self._unsupported}.items():
            if not _neutral(extra.get(name), neutral):
                raise refusal(name, f"'{name}' is not supported by this server", extra.get(name))
        return self


class StreamOptions(BaseModel):
    include_usage: bool = Field(False, description="Send a last chunk with the usage and no choices.")
    continuous_usage_stats: bool = Field(
        False, description="vLLM extension, with include_usage: every chunk carries the usage so far."
    )


class _Sampling(_Body):
    """What both endpoints take: the model, sampling, stop strings, choices and streaming."""

    model: str = Field(description="Served model name (`GET /v1/models`).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 decodes greedily.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass kept; 1 disables top-p.")
    top_k: int = Field(0, ge=-1, description="vLLM extension: keep the k most likely; 0 or -1 disables it.")
    min_p: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="vLLM extension: drop tokens less likely than min_p times the likeliest.",
    )
    ignore_eos: bool = Field(False, description="vLLM extension: EOS does not end the output.")
    min_tokens: int = Field(
        0, ge=0, description="vLLM extension: no EOS, stop token or stop string ends the first min_tokens."
    )
    stop_token_ids: list[int] | None = Field(
        None, description="vLLM extension: tokens that end the output (finish_reason stop), not in its text."
    )
    seed: int | None = Field(None, description="Seed of the sampler; choice i samples with seed + i.")
    stop: str | list[str] | None = Field(
        None, description="Up to 4 stop strings; the text ends before the token that completes one."
    )
    n: int = Field(1, ge=1, le=16, description="Choices per prompt.")
    stream: bool = Field(False, description="Send server-sent events, one chunk per update.")
    stream_options: StreamOptions | None = Field(None, description="Streaming only: include_usage.")
    user: str | None = Field(None, description="End-user id; accepted and not used.")

    @model_validator(mode="after")
    def _check_stop(self) -> Self:
        stops = self.stop_strings
        if len(stops) > 4:
            raise ValueError(f"'stop' takes at most 4 strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("'stop' strings must not be empty")
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Every chunk carries the usage so far (vLLM: only together with include_usage)."""
        return (
            self.include_usage
            and self.stream_options is not None
            and self.stream_options.continuous_usage_stats
        )


class CompletionRequest(_Sampling):
    """Body of `POST /v1/completions`."""

    _unsupported = _UNSUPPORTED_COMPLETION

    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="A prompt, a list of prompts, or token ids (one list, or a list of lists)."
    )
    max_tokens: int | None = Field(16, ge=1, description="Tokens to generate at most (OpenAI's 16).")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """Body of `POST /v1/chat/completions`."""

    _unsupported = _UNSUPPORTED_CHAT

    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_tokens: int | None = Field(None, ge=1, description="Deprecated by OpenAI for max_completion_tokens.")
    max_completion_tokens: int | None = Field(
        None, ge=1, description="Tokens to generate at most; default: what the context leaves."
    )

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens the prefix cache held (not prefilled)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # with a prefix cache only


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatChunkChoice(BaseModel):
    index: int
    delta: dict[str, str] = Field(description="The role on a choice's first chunk, then content.")
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specops"
    root: str = Field(description="The model the server loaded (alias, directory or hub id).")
    max_model_len: int = Field(description="The model's context in tokens.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, which its clients turn into BadRequestError, NotFoundError, ..."""

    error: ErrorBody


def error_response(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    """The JSON of an OpenAI-style error; `type` and `code` as OpenAI names them per status."""
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "invalid_request_error",
        503: "service_unavailable",
    }
    codes = {404: "model_not_found", 413: "request_too_large"}
    body = ErrorBody(
        message=message, type=kinds.get(status, "server_error"), param=param, code=codes.get(status)
    )
    return ErrorResponse(error=body).model_dump()
