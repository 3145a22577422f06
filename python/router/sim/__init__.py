"""A simulated OpenAI-compatible region for the demo, tests and benchmarks.

`router sim-region --port P --name N [--rtt-ms --ttft-ms --tokens-per-s --fail-mode ...]` serves
POST /v1/chat/completions, /v1/completions, /v1/embeddings; GET /v1/models, /health; and, for
tests, GET /sim/stats, POST /sim/reset, GET|POST /sim/config (change options live).

Per-request headers override the flags: x-sim-fail (none|refuse|500|503|429|hang|
die-mid-stream|drip|error-event|failed-event), x-sim-error-kind (server|overloaded|rate_limit|
invalid_request: the error event's), x-sim-after-tokens, x-sim-drip-ms, x-sim-ttft-ms,
x-sim-tokens-per-s, x-sim-rtt-ms, x-sim-pad-bytes (spaces after each streamed token, for
backpressure tests), and x-sim-only: NAME[,NAME] (faults apply only in the named regions).
`--unserved MODEL[,MODEL]` (or `unserved` in /sim/config): a region whose config drifted,
answering a request for one of them as vLLM answers a model it does not serve (404
NotFoundError, "The model `m` does not exist.").
`--sse-line-end lf|crlf|cr` (or `sse_line_end`): how its streams end SSE lines; cr is a lone
CR, legal SSE that real servers do not send but the router must read.
`--sse-fields none|all` (or `sse_fields`): all gives its streams SSE fields besides `data:`, as
some OpenAI-compatible servers send: a comment and `retry: 3000` first, an `id:` on every event,
`event: message` on chat and completions events.

Text is a pure function of model + messages (role and content only); a trailing assistant
message that is a prefix of that text is continued, so a resumed stream reproduces it exactly.
"""
