"""What SGLang 0.5.23 and vLLM put on the wire, as data: each field the stand-in emits, and where the server adds it.

Read in the sglang 0.5.23 wheel from PyPI (`pip download sglang==0.5.23 --no-deps`); paths are inside its `sglang/`
package. The stand-in (gpudoctor.bench.standin.server) follows these tables (its constants come from here), and
tests/bench/test_apispec.py checks the stand-in's chunks against them field by field and in order: following a new
SGLang release starts with an edit here, which the tests then hold the stand-in to.
Nothing here is SGLang's code: it is a list of names, when they appear, and the function that adds them.
"""

from __future__ import annotations

SGLANG_VERSION = "0.5.23"

# ---- native /generate, one entry per meta_info key: (name, when, source) --------------------------------------------
# when: "every" (every streamed chunk), "first" (the first streamed chunk only), "final" (the finishing chunk only),
# "metrics-every" / "metrics-final" (only with --enable-metrics), "spec-final" (final chunk, speculative decoding on).
TM = "srt/managers/tokenizer_manager.py"
RTS = "srt/observability/req_time_stats.py"
META_FIELDS: list[tuple[str, str, str]] = [
    ("id", "every", f"{TM} TokenizerManager._handle_batch_output"),
    ("finish_reason", "every", f"{TM} TokenizerManager._handle_batch_output (None until the last chunk)"),
    ("prompt_tokens", "every", f"{TM} TokenizerManager._handle_batch_output"),
    ("weight_version", "every", f"{TM} TokenizerManager._handle_batch_output (config_value('weight_version'))"),
    ("num_retractions", "every", f"{TM} TokenizerManager._handle_batch_output (recv_obj.retraction_counts)"),
    ("forward_entry_time", "metrics-every", f"{RTS} SchedulerReqTimeStats.convert_to_output_meta_info"),
    ("prefill_finished_time", "metrics-every", f"{RTS} SchedulerReqTimeStats.convert_to_output_meta_info"),
    ("queue_time", "metrics-every", f"{RTS} SchedulerReqTimeStats.convert_to_output_meta_info"),
    ("reasoning_tokens", "every", f"{TM} TokenizerManager._handle_batch_output"),
    ("completion_tokens", "every", f"{TM} TokenizerManager._handle_batch_output (cumulative)"),
    ("cached_tokens", "every", f"{TM} TokenizerManager._handle_batch_output"),
    ("e2e_latency", "final", f"{TM} TokenizerManager._handle_batch_output (state.finished)"),
    ("spec_accept_rate", "spec-final", f"{TM} TokenizerManager._calculate_spec_decoding_metrics"),
    ("spec_accept_length", "spec-final", f"{TM} TokenizerManager._calculate_spec_decoding_metrics"),
    ("spec_num_correct_drafts", "spec-final", f"{TM} TokenizerManager._calculate_spec_decoding_metrics"),
    ("spec_num_proposed_drafts", "spec-final", f"{TM} TokenizerManager._calculate_spec_decoding_metrics"),
    ("spec_verify_ct", "spec-final", f"{TM} TokenizerManager._calculate_spec_decoding_metrics"),
    ("spec_correct_drafts_histogram", "spec-final", f"{TM} TokenizerManager._calculate_spec_decoding_metrics"),
    ("request_received_ts", "metrics-final", f"{RTS} APIServerReqTimeStats.convert_to_output_meta_info"),
    ("first_token_latency", "metrics-final", f"{RTS} APIServerReqTimeStats.convert_to_output_meta_info"),
    ("api_server_dispatch_finish_ts", "metrics-final", f"{RTS} APIServerReqTimeStats.convert_to_output_meta_info"),
    ("response_sent_to_client_ts", "first", f"{TM} TokenizerManager._wait_one_response (set once, before the "
                                            "first yield; with --enable-metrics repeated on the final chunk)"),
    ("request_finished_ts", "metrics-final", f"{RTS} APIServerReqTimeStats.convert_to_output_meta_info"),
    ("decode_throughput", "metrics-final", f"{RTS} APIServerReqTimeStats.convert_to_output_meta_info"),
]

# Fields older releases or other tools invented and 0.5.23 never sends: a client must not rely on them.
NOT_IN_0_5_23 = ("prefill_finished_ts", "decode_finished_ts", "total_retractions", "spec_accept_token_num",
                 "spec_draft_token_num")

# Top-level keys of a native streamed chunk: `text` and `output_ids` are cumulative unless the server runs with
# --incremental-streaming-output (TokenizerManager._handle_batch_output, BatchStrOutput branch).
CHUNK_KEYS = ("text", "output_ids", "meta_info")

# An abort (queue full, timeout, OOM, ...), TokenizerManager._handle_abort_req: these meta keys only, finish_reason
# from the scheduler's FINISH_ABORT.to_json (srt/managers/schedule_batch.py) with status_code and err_type.
ABORT_META = ("id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens")
ABORT_FINISH_KEYS = ("type", "message", "status_code", "err_type")
QUEUE_FULL_MESSAGE = "The request queue is full."  # srt/managers/scheduler.py Scheduler._abort_on_queued_limit
QUEUE_FULL_STATUS = 503

# A ValueError inside a streamed /generate (srt/entrypoints/http_server.py serve_generate_request): one chunk, then
# [DONE], HTTP status 200. Non-streamed: _create_error_response, {"error": {"message"}} with the exception's status.
STREAM_ERROR_KEYS = ("message", "type", "code", "retryable")

# /health and /health_generate (http_server.py health_generate): 503 while starting; otherwise a one-token
# generation, polled every second (asyncio.sleep(1)) until the detokenizer answered, for at most
# SGLANG_HEALTH_CHECK_TIMEOUT s (20). /health generates too unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false
# (srt/environ.py, default true). /ready answers at once (200/503).
HEALTH_POLL_S = 1.0
HEALTH_TIMEOUT_S = 20.0
# uvicorn.Config(timeout_keep_alive=envs.SGLANG_TIMEOUT_KEEP_ALIVE) in http_server.py launch_server; environ.py: 5.
KEEP_ALIVE_S = 5.0

# ---- OpenAI-compatible routes (srt/entrypoints/openai/) -------------------------------------------------------------
# /v1/models: ModelList of ModelCard (protocol.py): id, object "model", created, owned_by "sglang", root, parent,
# max_model_len (http_server.py available_models: the served model name, context_len).
MODEL_CARD_KEYS = ("id", "object", "created", "owned_by", "root", "parent", "max_model_len")
# UsageInfo (protocol.py), per chunk with stream_options.continuous_usage_stats (serving_completions.py
# OpenAIServingCompletion._generate_completion_stream, serving_chat.py _generate_stream_content), and once more in a
# final `choices: []` chunk with include_usage (exclude_none there).
USAGE_KEYS = ("prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details", "reasoning_tokens",
              "completion_tokens_details")
# sglext.spec_tokens_details (protocol.py SpecTokensDetails), a `choices: []` chunk before the usage chunk when the
# request set return_spec_tokens_details (serving_completions.py; utils.py spec_tokens_details_from_meta_info).
SPEC_DETAILS_KEYS = ("spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
                     "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                     "spec_correct_drafts_histogram", "spec_cap_lens_histogram")
# ErrorResponse (protocol.py): a non-streamed error has this body and status `code`; a streamed one is
# `data: {"error": {...}}` (serving_base.py create_streaming_error_response). An abort with a status_code in the
# stream becomes that error chunk named after the HTTPStatus (e.g. type "SERVICE_UNAVAILABLE", code 503).
ERROR_KEYS = ("object", "message", "type", "param", "code")

# ---- vLLM (vllm/entrypoints/openai/): what differs -----------------------------------------------------------------
# /health answers 200 at once while the engine is alive (no generation); there is no /generate or /health_generate;
# chunks carry `stop_reason` next to finish_reason; errors are {"error": {"message", "type", "param", "code"}};
# speculative decoding has no per-request accept length in the API (only Prometheus counters on /metrics).
VLLM_MODEL_CARD_KEYS = ("id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission")
VLLM_ERROR_KEYS = ("message", "type", "param", "code")

# ---- what an OpenAI-API request may carry, per dialect: (field, dialects that take it, where) ------------------------
# openai.request_body builds bodies from this table. OpenAI's own request schema goes to every server; an extension only
# to the dialects listed: a server that validates against OpenAI's schema (transformers serve 5.17) answers HTTP 422 to
# any other field, and vLLM logs "The following fields were present in the request but ignored" for one it lacks
# (its OpenAIBaseModel allows extra fields). "stream_options.X" is a key inside stream_options.
OPENAI_SCHEMA = ("sglang", "vllm", "openai")
REQUEST_FIELDS: list[tuple[str, tuple[str, ...], str]] = [
    ("model", OPENAI_SCHEMA, "openai completion_create_params / chat.completion_create_params"),
    ("prompt", OPENAI_SCHEMA, "openai completion_create_params (/v1/completions; token ids only to sglang, vllm)"),
    ("messages", OPENAI_SCHEMA, "openai chat.completion_create_params (/v1/chat/completions)"),
    ("max_tokens", OPENAI_SCHEMA, "openai completion_create_params"),
    ("temperature", OPENAI_SCHEMA, "openai completion_create_params"),
    ("stream", OPENAI_SCHEMA, "openai completion_create_params"),
    ("stream_options.include_usage", OPENAI_SCHEMA, "openai ChatCompletionStreamOptionsParam"),
    ("ignore_eos", ("sglang", "vllm"), "sglang srt/entrypoints/openai/protocol.py CompletionRequest, "
                                      "ChatCompletionRequest; vllm entrypoints/openai/protocol.py (sampling params)"),
    ("stream_options.continuous_usage_stats", ("sglang", "vllm"), "sglang protocol.py StreamOptions; vllm "
                                                                  "protocol.py StreamOptions"),
    ("return_spec_tokens_details", ("sglang",), "sglang protocol.py CompletionRequest, ChatCompletionRequest "
                                                "(utils.py process_spec_tokens_details_from_ret); vLLM has none"),
]


def takes(kind: str | None, field: str) -> bool:
    """Whether a server of dialect `kind` (openai.SERVER_KINDS) takes request field `field` (REQUEST_FIELDS)."""
    return any(name == field and kind in kinds for name, kinds, _ in REQUEST_FIELDS)
