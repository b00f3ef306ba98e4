"""The stand-in's wire formats: SGLang 0.5.23's native and OpenAI chunks, and vLLM's, as gpudoctor.bench.client.apispec lists them.

Pure functions from a request's state to the JSON a real server would send at that point of the stream; the server
(gpudoctor.bench.standin.server) decides when. Key order follows the real servers (it matters to clients that scan bytes).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

WORDS = ("the", "model", "decodes", "tokens", "while", "drafts", "are", "verified", "in", "one", "step", "and")


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else dumps(obj)) + b"\n\n"


DONE = b"data: [DONE]\n\n"


@dataclass
class ReqState:
    """One request as the stand-in's scheduler sees it; wall-clock stamps are time.time()."""

    rid: str
    prompt_tokens: int
    max_new: int
    received: float
    forward_entry: float | None = None
    first_token: float | None = None
    finished: float | None = None
    sent_first: float | None = None  # response_sent_to_client_ts: set once, before the first chunk is written
    done: int = 0  # tokens produced so far
    steps: int = 0
    step_tokens: int = 0  # tokens of the latest step
    text_parts: list[str] = field(default_factory=list)
    correct_per_step: list[int] = field(default_factory=list)  # accepted drafts of each verify step
    cached: int = 0  # prompt tokens found in the prefix cache (meta_info.cached_tokens)
    ttft_ms: float | None = None  # this request's TTFT when the prefix cache shortened it
    cache_key: object = None

    def advance(self, n: int) -> None:
        for i in range(self.done, self.done + n):
            self.text_parts.append(" " + WORDS[i % len(WORDS)])
        self.done += n
        self.steps += 1
        self.correct_per_step.append(n - 1)
        self.step_tokens = n
        now = time.time()
        if self.first_token is None:
            self.first_token = now
        if self.done >= self.max_new:
            self.finished = now

    def text(self, delta: bool = False) -> str:
        return "".join(self.text_parts[-self.step_tokens:] if delta else self.text_parts)

    def output_ids(self, delta: bool = False) -> list[int]:
        return list(range(self.done - self.step_tokens, self.done)) if delta else list(range(self.done))


@dataclass
class Spec:
    """Speculative decoding as configured: accept length and --speculative-num-draft-tokens."""

    accept_length: float
    num_draft_tokens: int

    def meta(self, st: ReqState) -> dict:
        """_calculate_spec_decoding_metrics: proposed = verify_ct x (draft tokens - 1); correct excludes the bonus."""
        proposed = st.steps * (self.num_draft_tokens - 1)
        correct = st.done - st.steps
        hist = [0] * self.num_draft_tokens
        for c in st.correct_per_step:
            hist[min(c, self.num_draft_tokens - 1)] += 1
        return {"spec_accept_rate": correct / proposed if proposed else 0.0,
                "spec_accept_length": st.done / st.steps, "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": proposed, "spec_verify_ct": st.steps,
                "spec_correct_drafts_histogram": hist}


# ---- SGLang native /generate ---------------------------------------------------------------------------------------
def native_chunk(st: ReqState, *, metrics: bool, spec: Spec | None, incremental: bool, stream: bool) -> dict:
    """One /generate output (apispec.META_FIELDS), text and output_ids cumulative unless incremental."""
    finished = st.finished is not None
    meta = {"id": st.rid, "finish_reason": {"type": "length", "length": st.max_new} if finished else None,
            "prompt_tokens": st.prompt_tokens, "weight_version": "default", "num_retractions": 0}
    if metrics:
        meta.update(_scheduler_stats(st))
    meta.update({"reasoning_tokens": 0, "completion_tokens": st.done, "cached_tokens": st.cached})
    if finished:
        meta["e2e_latency"] = st.finished - st.received
        if spec is not None:
            meta.update(spec.meta(st))
        if metrics:
            meta.update(_api_server_stats(st))
    if st.sent_first is None:
        st.sent_first = time.time()
        meta["response_sent_to_client_ts"] = st.sent_first
    delta = incremental and stream
    return {"text": st.text(delta), "output_ids": st.output_ids(delta), "meta_info": meta}


def _scheduler_stats(st: ReqState) -> dict:
    out = {}
    if st.forward_entry:
        out["forward_entry_time"] = st.forward_entry
    if st.first_token:
        out["prefill_finished_time"] = st.first_token
    out["queue_time"] = (st.forward_entry or st.received) - st.received
    return out


def _api_server_stats(st: ReqState) -> dict:
    out = {"request_received_ts": st.received}
    if st.first_token and st.first_token > st.received:
        out["first_token_latency"] = st.first_token - st.received
    out["api_server_dispatch_finish_ts"] = st.received
    if st.sent_first:
        out["response_sent_to_client_ts"] = st.sent_first
    out["request_finished_ts"] = st.finished
    if st.done > 1 and st.finished > st.first_token:
        out["decode_throughput"] = (st.done - 1) / (st.finished - st.first_token)
    return out


def native_abort(st: ReqState, message: str, status: int) -> dict:
    """TokenizerManager._handle_abort_req for a request aborted before its first token (apispec.ABORT_META)."""
    meta = {"id": st.rid, "finish_reason": {"type": "abort", "message": message, "status_code": status,
                                            "err_type": None},
            "weight_version": "default", "e2e_latency": time.time() - st.received, "completion_tokens": st.done}
    st.sent_first = time.time()
    meta["response_sent_to_client_ts"] = st.sent_first  # _wait_one_response adds it to a finished output too
    return {"text": st.text(), "output_ids": st.output_ids(), "meta_info": meta}


def native_stream_error(message: str, code: int = 400) -> dict:
    """serve_generate_request: a ValueError in a stream becomes one chunk (then [DONE], status 200)."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}}


# ---- OpenAI-compatible (SGLang and vLLM) -------------------------------------------------------------------------------
@dataclass
class OpenAIReq:
    """What an OpenAI request asked for, as the server reads it."""

    chat: bool
    model: str
    include_usage: bool
    continuous: bool
    spec_details: bool
    created: int = field(default_factory=lambda: int(time.time()))


def read_openai(body: dict, chat: bool, flavor: str) -> OpenAIReq:
    so = body.get("stream_options") or {}
    include = bool(so.get("include_usage"))
    continuous = bool(so.get("continuous_usage_stats"))
    if flavor == "vllm":  # vLLM: continuous stats only together with include_usage
        continuous = continuous and include
    return OpenAIReq(chat=chat, model=str(body.get("model") or ""), include_usage=include, continuous=continuous,
                     spec_details=bool(body.get("return_spec_tokens_details")) and flavor == "sglang")


def usage(prompt: int, completion: int, flavor: str, final: bool = False) -> dict:
    if flavor == "vllm":
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
                "prompt_tokens_details": None}
    u = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
         "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}
    return {k: v for k, v in u.items() if v is not None} if final else u  # the final chunk is exclude_none


def _choice(req: OpenAIReq, text: str | None, finish: str | None, flavor: str, role: bool = False) -> dict:
    if req.chat:
        delta = {"role": "assistant", "content": ""} if role else {"role": None, "content": text}
        if flavor == "sglang":
            delta["reasoning_content"] = None
        else:
            delta = {k: v for k, v in delta.items() if v is not None} or {"content": ""}
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        c = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    if flavor == "sglang":
        c["matched_stop"] = None
    else:
        c["stop_reason"] = None
    return c


def _envelope(st: ReqState, req: OpenAIReq, choices: list, flavor: str) -> dict:
    prefix = ("chatcmpl-" if req.chat else "cmpl-") if flavor == "vllm" else ""
    return {"id": prefix + st.rid, "object": "chat.completion.chunk" if req.chat else "text_completion",
            "created": req.created, "model": req.model, "choices": choices}


def openai_role_chunk(st: ReqState, req: OpenAIReq, flavor: str) -> dict:
    """Chat's first chunk: the assistant role and empty content (serving_chat.py, vLLM alike)."""
    out = _envelope(st, req, [_choice(req, "", None, flavor, role=True)], flavor)
    if req.continuous:
        out["usage"] = usage(st.prompt_tokens, 0, flavor)
    elif flavor == "sglang":
        out["usage"] = None
    return out


def openai_chunk(st: ReqState, req: OpenAIReq, flavor: str) -> dict:
    """A content chunk: the step's text as a delta; per-chunk usage with continuous_usage_stats."""
    finish = "length" if st.finished is not None else None
    out = _envelope(st, req, [_choice(req, st.text(delta=True), finish, flavor)], flavor)
    if req.continuous:
        out["usage"] = usage(st.prompt_tokens, st.done, flavor)
    elif flavor == "sglang":
        out["usage"] = None
    return out


def openai_tail(st: ReqState, req: OpenAIReq, flavor: str, spec: Spec | None) -> list[dict]:
    """After the last content chunk: sglext.spec_tokens_details (SGLang, when asked), then the usage chunk."""
    tail = []
    if req.spec_details and spec is not None and st.steps:
        details = {k: 0.0 for k in ("spec_accept_rate", "spec_accept_length", "spec_cap_length",
                                    "spec_block_accept_length")}
        details.update({"spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0, "spec_verify_ct": 0,
                        "spec_correct_drafts_histogram": [], "spec_cap_lens_histogram": []})
        details.update(spec.meta(st))
        ext = {"routed_experts": None, "cached_tokens_details": None, "spec_tokens_details": details,
               "input_ids": None, "output_ids": None}
        tail.append({**_envelope(st, req, [], flavor), "usage": None, "sglext": ext})
    if req.include_usage:
        tail.append({**_envelope(st, req, [], flavor), "usage": usage(st.prompt_tokens, st.done, flavor, True)})
    return tail


def openai_error(message: str, err_type: str, code: int, flavor: str) -> dict:
    """ErrorResponse: SGLang's flat body (protocol.py), vLLM's nested {"error": {...}}."""
    if flavor == "vllm":
        return {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def openai_stream_error(message: str, err_type: str, code: int, flavor: str) -> dict:
    """create_streaming_error_response: {"error": ErrorResponse} (SGLang), vLLM's error body as is."""
    if flavor == "vllm":
        return openai_error(message, err_type, code, flavor)
    return {"error": openai_error(message, err_type, code, flavor)}


def model_list(model: str, context_len: int, flavor: str) -> dict:
    """GET /v1/models: one card for the served model (apispec.MODEL_CARD_KEYS / VLLM_MODEL_CARD_KEYS)."""
    card = {"id": model, "object": "model", "created": int(time.time()),
            "owned_by": "vllm" if flavor == "vllm" else "sglang", "root": model, "parent": None,
            "max_model_len": context_len}
    if flavor == "vllm":
        card["permission"] = [{"id": "modelperm-standin", "object": "model_permission", "created": card["created"],
                               "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                               "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                               "organization": "*", "group": None, "is_blocking": False}]
    return {"object": "list", "data": [card]}



# ---- a strict OpenAI-schema server (flavor "openai": Hugging Face transformers serve 5.17 as it behaves) -------------
# transformers/cli/serving/utils.py BaseHandler._validate_request: any key outside the params TypedDict's keys is
# HTTP 422 "Unexpected fields in the request: {...}"; completion.py and chat_completion.py add these keys to OpenAI's.
STRICT_EXTRA_KEYS = {False: ("generation_config", "seed", "stream"), True: ("generation_config", "seed",
                                                                           "chat_template_kwargs")}


def _typed_keys(td) -> set[str]:
    keys = getattr(td, "__mutable_keys__", None)
    return set(keys) if keys is not None else set(td.__required_keys__) | set(td.__optional_keys__)


def openai_schema_keys(chat: bool) -> tuple[set[str], set[str]]:
    """The request keys OpenAI's own types allow (the `openai` package's streaming create params, plus transformers
    serve's additions) and the keys of stream_options (ChatCompletionStreamOptionsParam)."""
    from openai.types.chat import ChatCompletionStreamOptionsParam
    if chat:
        from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
    else:
        from openai.types.completion_create_params import CompletionCreateParamsStreaming
    return (_typed_keys(CompletionCreateParamsStreaming) | set(STRICT_EXTRA_KEYS[chat]),
            _typed_keys(ChatCompletionStreamOptionsParam))


def strict_unexpected(body: dict, chat: bool) -> str | None:
    """The 422 detail for a request with fields outside OpenAI's schema (top level, or inside stream_options), None
    when it has none. The set is written as Python writes it, as transformers serve does."""
    allowed, stream_keys = openai_schema_keys(chat)
    extra = set(body) - allowed
    so = body.get("stream_options")
    if isinstance(so, dict):
        extra |= {f"stream_options.{k}" for k in set(so) - stream_keys}
    return f"Unexpected fields in the request: {extra}" if extra else None


def strict_chunk(st: ReqState, req: OpenAIReq, text: str | None = None, finish: str | None = None,
                 usage_: dict | None = None, role: bool = False) -> dict:
    """A chunk as transformers serve writes it (model_dump_json(exclude_none=True)): no finish_reason key until the
    final chunk, which also carries the usage; chat's first chunk has only the role."""
    if req.chat:
        delta = {"role": "assistant"} if role else ({"content": text} if text else {})
        choice: dict = {"delta": delta, "index": 0}
    else:
        choice = {"index": 0, "text": text or ""}
    if finish:
        choice["finish_reason"] = finish
    out = {"id": st.rid, "choices": [choice], "created": req.created, "model": req.model,
           "object": "chat.completion.chunk" if req.chat else "text_completion"}
    if req.chat:
        out["system_fingerprint"] = ""
    if usage_:
        out["usage"] = usage_
    return out


def strict_usage(prompt: int, completion: int) -> dict:
    """CompletionUsage, exclude_none: only the three counts."""
    return {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion}


def strict_stream_error(message: str) -> bytes:
    """The mid-stream error transformers serve writes: f'data: {{"error": "{msg}"}}', the text NOT escaped."""
    return b'data: {"error": "' + message.encode() + b'"}\n\n'


def strict_model_list(models: list[str]) -> dict:
    """GET /v1/models: the hub cache's generative models (model_manager.get_gen_models), not the pinned one."""
    return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": m.split("/")[0]
                                        if "/" in m else ""} for m in models]}
