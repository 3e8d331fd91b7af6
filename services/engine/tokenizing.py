"""vLLM's `/tokenize` and `/detokenize`: the served model's tokenizer, as the completion
endpoints use it, so that a client can count a prompt's tokens before sending it.

`/tokenize` takes a `prompt` (tokenized as `/v1/completions` tokenizes it, special tokens
added unless `add_special_tokens` is false) or `messages` (rendered through the chat
template as `/v1/chat/completions` renders them; `add_generation_prompt` as vLLM has it) and
answers `{count, max_model_len, tokens}` (and `token_strs` with `return_token_strs`);
`/detokenize` takes `tokens` and answers `{prompt}`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from speccore.models import LoadedModel
from specops_services.engine import logic
from specops_services.engine.protocol import ChatMessage
from specops_services.engine.serving import InvalidRequest


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields ignored, as vLLM does

    model: str | None = Field(None, description="Served model name; any when absent.")


class _Tokenize(_Body):
    return_token_strs: bool = Field(False, description="Also answer each token's string (`token_strs`).")


class TokenizeCompletionRequest(_Tokenize):
    prompt: str = Field(description="Text, tokenized as `/v1/completions` tokenizes a prompt.")
    add_special_tokens: bool = Field(True, description="Add the tokenizer's special tokens (bos).")


class TokenizeChatRequest(_Tokenize):
    messages: list[ChatMessage] = Field(
        min_length=1, description="A conversation, through the chat template."
    )
    add_generation_prompt: bool = Field(True, description="End with the assistant's turn marker.")
    add_special_tokens: bool = Field(False, description="Add special tokens beside the template's own.")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Body):
    tokens: list[int] = Field(description="Token ids of the served model.")


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


def tokenize(target: LoadedModel, body: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
    tokenizer = target.tokenizer
    context = target.max_context
    if isinstance(body, TokenizeChatRequest):
        if not tokenizer.chat_template:
            raise InvalidRequest(400, f"model '{target.ref}' has no chat template; send a prompt", "messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        _check_chars(sum(len(m["content"]) for m in messages), context, "messages")
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=body.add_generation_prompt
        )
        ids = list(tokenizer(rendered, add_special_tokens=body.add_special_tokens).input_ids)
    else:
        _check_chars(len(body.prompt), context, "prompt")
        ids = list(tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids)
    strs = list(tokenizer.convert_ids_to_tokens(ids)) if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=context, tokens=ids, token_strs=strs)


def detokenize(target: LoadedModel, body: DetokenizeRequest) -> DetokenizeResponse:
    vocab = len(target.tokenizer)
    unknown = [t for t in body.tokens if not 0 <= t < vocab]
    if unknown:
        raise InvalidRequest(
            400, f"token id {unknown[0]} is not in the vocabulary (0..{vocab - 1})", "tokens"
        )
    return DetokenizeResponse(prompt=str(target.tokenizer.decode(body.tokens)))


def _check_chars(chars: int, context: int, param: str) -> None:
    """A 400 for text too long for any prompt of the context, before tokenizing it."""
    limit = logic.prompt_chars_limit(context)
    if chars > limit:
        raise InvalidRequest(
            400, f"the text has {chars} characters, more than a {context}-token context can hold", param
        )
