"""The replay (llamacpp/replay.py, ngram_replay.cpp): a token stream the real llama-server
generated, replayed through the pin's own n-gram drafters, gives each candidate exactly what the
server counted on it: drafted and accepted tokens per request (tolerance: none, the counts must
be equal). The server's stream is recorded as token ids (/completion with return_tokens, the
prompt sent as ids), so nothing here depends on which words a model chose on this CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tiny_gguf
from bonsai_launch.llamacpp import replay as rp

# Each n-gram candidate `bonsai tune` screens by replay: every type, a shorter draft length,
# and the combined types (llama.cpp tries them in its own order).
CANDIDATES = {
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-map-k4v": ["--spec-type", "ngram-map-k4v"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-mod/n16": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "--spec-ngram-mod-n-min", "16"],
    "ngram-simple/n8": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "8"],
    "ngram-simple+ngram-mod": ["--spec-type", "ngram-simple,ngram-mod"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
}


def test_the_replay_takes_a_launchs_draft_free_flags_and_nothing_else():
    argv = ["llama-server", "-m", "m.gguf", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "-c", "4096"]
    assert rp.replay_args(argv) == ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16"]
    assert rp.replay_args(["llama-server", "--spec-type", "ngram-simple,ngram-mod"]) == [
        "--spec-type",
        "ngram-simple,ngram-mod",
    ]
    assert rp.replay_args(["llama-server", "-md", "d.gguf", "--spec-type", "draft-dspark"]) is None  # needs its model
    assert rp.replay_args(["llama-server", "--spec-type", "ngram-mod,draft-mtp"]) is None
    assert rp.replay_args(["llama-server", "-m", "m.gguf"]) is None  # plain


def test_a_replay_line_reads_as_counts_and_steps():
    r = rp.parse_line("3 2 20 12 : 16,10 4,2")
    assert (r.plain_steps, r.spec_steps, r.drafted, r.accepted, r.steps) == (3, 2, 20, 12, ((16, 10), (4, 2)))
    assert r.tokens == 3 + 2 + 12


def test_a_binary_outside_a_bonsai_build_has_no_replay(tmp_path):
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "llama-server"
    binary.write_text("")
    with pytest.raises(rp.ReplayUnavailable, match="not a bonsai build"):
        rp.tool_for(binary)


def record(server: tiny_gguf.TinyServer, prompts: list[str], n_predict: int) -> list[tuple[rp.Stream, int, int]]:
    """Each prompt as ids, the ids the server generated and what it counted as drafted/accepted."""
    out = []
    for text in prompts:
        ids = server.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
        answer = server.completion(ids, n_predict, return_tokens=True)
        timings = answer["timings"]
        stream = rp.Stream(tuple(ids), tuple(answer["tokens"]), n_predict)
        out.append((stream, int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))))
    return out


def check_every_candidate(binary: Path, model: Path, prompts: list[str], n_predict: int, tmp_path: Path) -> int:
    """Serve each candidate, record its streams, replay them: equal counts. Returns tokens drafted."""
    tool = rp.tool_for(binary)
    drafted_total = 0
    for name, args in CANDIDATES.items():
        server_args = ["-m", model, "-c", "4096", "-np", "1", "--temp", "0", *args]
        with tiny_gguf.serve(binary, server_args, tmp_path / f"{name.replace('/', '_')}.log") as server:
            recorded = record(server, prompts, n_predict)
        replayed = rp.replay(tool, args, [stream for stream, _, _ in recorded])
        server_counts = [(d, a) for _, d, a in recorded]
        assert [(r.drafted, r.accepted) for r in replayed] == server_counts, name
        drafted_total += sum(d for d, _ in server_counts)
    return drafted_total


@pytest.mark.server
def test_the_replay_gives_the_servers_counts_on_a_tiny_models_stream(llama_server, tmp_path):
    """A tiny target repeats one token: every type drafts, each up to its own length and the
    request's end (n_remaining - 1), across three requests through one drafter state."""
    model = tiny_gguf.write_target(tmp_path / "target.gguf")
    assert check_every_candidate(llama_server, model, ["hello world", "1 2 3 4 5", "a b a b"], 40, tmp_path) > 0


def test_the_replay_gives_the_servers_counts_on_the_demo_models_stream(llama_server, demo_gguf, tmp_path):
    """Real text, drafts partly rejected: a copy, a continued pattern and a free answer, one after
    the other (ngram-mod's table and ngram-map's keys carry over between them, as in the server)."""
    prompts = [
        "Copy this code exactly:\ndef area(w, h):\n    return w * h\n\nprint(area(3, 4))\n\nCopy:\n",
        "one two three four, one two three four, one two three four, one two",
        "The three most useful kitchen tools are",
    ]
    assert check_every_candidate(llama_server, demo_gguf, prompts, 96, tmp_path) > 0
