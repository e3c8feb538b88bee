"""The token streams of measured requests: what the server was asked (the prompt as it
tokenized it) and what it generated, for replaying draft-free candidates on them
(llamacpp/replay.py) at no model cost.

The streamed API returns text, not token ids; the server itself turns the text back into
tokens (/apply-template for a chat, /tokenize). At temperature 0 the model's own tokens and
the text's tokens agreed token for token on every answer checked (docs/benchmarks.md, issue
47); where they do not, the replay is off by the few tokens around the difference.
"""

from __future__ import annotations

from collections.abc import Sequence

from bonsai_launch.bench import prompts as suite
from bonsai_launch.bench.measure import Endpoint, RequestResult
from bonsai_launch.llamacpp.replay import Stream
from bonsai_launch.server import client


def prompt_text(endpoint: Endpoint, prompt: suite.Prompt) -> str:
    """The prompt as the server's model saw it: the chat template applied to a chat."""
    if prompt.raw:
        return prompt.messages[0][1]
    if endpoint.api == "completion":
        return prompt.completion_text()
    out = client.post_json(endpoint.base_url, "/apply-template", {"messages": prompt.chat_messages()}, endpoint.api_key)
    return str(out.get("prompt") or "")


def record(
    endpoint: Endpoint,
    prompts: Sequence[suite.Prompt],
    results: Sequence[RequestResult],
    max_tokens: int,
    n_ctx: int = 0,
) -> dict[str, Stream]:
    """One stream per answered prompt (by prompt id), tokenized by the server at `endpoint`."""
    by_id = {p.id: p for p in prompts}
    out: dict[str, Stream] = {}
    for result in results:
        prompt = by_id.get(result.prompt_id)
        if prompt is None or result.error or not result.text:
            continue
        tokens = client.tokenize(endpoint.base_url, prompt_text(endpoint, prompt), endpoint.api_key, prompt=True)
        generated = client.tokenize(endpoint.base_url, result.text, endpoint.api_key)
        out[prompt.id] = Stream(tuple(tokens), tuple(generated), prompt.max_tokens or max_tokens, n_ctx)
    return out
