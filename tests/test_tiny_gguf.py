"""The tiny GGUF generator: our header reader understands its files, and the real llama-server
loads them, speculates with them, and refuses the broken ones the way tiny_gguf documents."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFReader

import tiny_gguf as tg
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.models.gguf import check_pair, inspect_gguf

SPEC_FAILED = "failed to initialize speculative decoding context"


def _spec_args(target: Path, drafter: Path, kind: str = "draft-dspark", n_max: int = 4) -> list[str]:
    return [
        "-m",
        target,
        "-md",
        drafter,
        "--spec-type",
        kind,
        "--spec-draft-n-max",
        str(n_max),
        "-np",
        "1",
        "-c",
        "4096",
    ]


# --- header reader -----------------------------------------------------------------------------


def test_target_header(tmp_path):
    info = inspect_gguf(tg.write_target(tmp_path / "t.gguf", chat_template="{{ messages }}"))
    assert (info.architecture, info.layers, info.embedding, info.vocab_size) == ("qwen3", 2, 64, 512)
    assert (info.head_count, info.head_count_kv, info.key_length, info.context_length) == (4, 2, 16, 32768)
    assert info.tokenizer_model == "test" and info.has_chat_template
    assert info.drafter is None and info.file_size < 1_000_000
    llama = inspect_gguf(tg.write_target(tmp_path / "l.gguf", arch="llama", layers=3, embedding=32, vocab=300))
    assert (llama.architecture, llama.layers, llama.embedding, llama.vocab_size) == ("llama", 3, 32, 300)


@pytest.mark.parametrize(
    ("writer", "kwargs", "kind", "arch"),
    [
        (tg.write_dspark_drafter, {}, "dspark", "dflash"),
        (tg.write_dflash_drafter, {}, "dflash", "dflash"),
        (tg.write_dspark_drafter, {"legacy": True}, "legacy-dspark", "dspark"),
    ],
)
def test_drafter_header(tmp_path, writer, kwargs, kind, arch):
    info = inspect_gguf(writer(tmp_path / "d.gguf", block_size=8, target_layers=(0, 1), **kwargs))
    assert info.architecture == arch and info.embedding == 64 and info.vocab_size == 512
    assert info.block_size == 8 and info.file_size < 1_000_000
    d = info.drafter
    assert d is not None
    assert (d.kind, d.block_size, d.target_layers, d.mask_token_id, d.draft_layers) == (kind, 8, (0, 1), 511, 1)


def test_drafter_options(tmp_path):
    info = inspect_gguf(
        tg.write_dspark_drafter(tmp_path / "d.gguf", omit_block_size=True, mask_token_id=3, confidence_head=True)
    )
    assert info.block_size is None and info.drafter.block_size is None
    assert info.drafter.mask_token_id == 3 and info.drafter.has_confidence_head
    legacy = inspect_gguf(tg.write_dspark_drafter(tmp_path / "l.gguf", legacy=True, omit_block_size=True))
    assert legacy.drafter.kind == "legacy-dspark" and legacy.block_size is None


def test_pair_checks(tmp_path):
    target = inspect_gguf(tg.write_target(tmp_path / "t.gguf"))
    good = inspect_gguf(tg.write_dspark_drafter(tmp_path / "d.gguf"))
    assert check_pair(target, good) == []
    assert check_pair(target, inspect_gguf(tg.write_dflash_drafter(tmp_path / "f.gguf"))) == []

    def problems(**kwargs) -> str:
        drafter = inspect_gguf(tg.write_dspark_drafter(tmp_path / "x.gguf", **kwargs))
        return "\n".join(check_pair(target, drafter))

    assert "embedding size 32" in problems(target_embedding=32)
    assert "256 tokens" in problems(vocab=256)
    assert "different token lists" in problems(tokens_like_target=False)
    assert "different token lists" in problems(token_prefix="x")
    assert "target layers [2]" in problems(target_layers=(1, 2))
    assert "mask token id 600" in problems(mask_token_id=600)
    assert "no block size" in problems(omit_block_size=True)
    assert "legacy" in problems(legacy=True)
    llama_target = inspect_gguf(tg.write_target(tmp_path / "l.gguf", arch="llama"))
    assert check_pair(llama_target, good) == []


def test_same_seed_same_bytes_and_atomic_write(tmp_path):
    a = tg.write_target(tmp_path / "a.gguf", seed=3).read_bytes()
    b = tg.write_target(tmp_path / "b.gguf", seed=3).read_bytes()
    c = tg.write_target(tmp_path / "c.gguf", seed=4).read_bytes()
    assert a == b and a != c
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "c.gguf"]  # no temp files left


def test_broken_files(tmp_path):
    path = tg.write_target(tmp_path / "t.gguf")
    tg.truncate(path, path.stat().st_size // 2)
    with pytest.raises(BonsaiError, match="truncated"):
        inspect_gguf(path)
    tg.truncate(path, 100)
    with pytest.raises(BonsaiError, match="truncated"):
        inspect_gguf(path)
    with pytest.raises(BonsaiError, match="not a GGUF"):
        inspect_gguf(tg.write_not_gguf(tmp_path / "n.gguf"))


def test_constant_token_out_of_range(tmp_path):
    with pytest.raises(ValueError):
        tg.write_target(tmp_path / "t.gguf", vocab=16, constant_token=16)


# --- the real llama-server ---------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_server_loads_target(tmp_path, llama_server, arch):
    target = tg.write_target(tmp_path / "t.gguf", arch=arch)
    with tg.serve(llama_server, ["-m", target, "-np", "1", "-c", "4096"], tmp_path / "s.log") as srv:
        out = srv.completion(n_predict=8)
    assert out["timings"]["predicted_n"] == 8
    assert out["content"]  # the test tokenizer prints token ids in hex


@pytest.mark.server
def test_server_chat_with_template(tmp_path, llama_server):
    template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"
    target = tg.write_target(tmp_path / "t.gguf", chat_template=template, constant_token=10)
    with tg.serve(llama_server, ["-m", target, "-np", "1", "-c", "4096"], tmp_path / "s.log") as srv:
        out = srv.post(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        )
    assert out["choices"][0]["message"]["content"] == "a" * 4  # token 10 prints as hex "a"


@pytest.mark.server
@pytest.mark.parametrize(
    ("writer", "kind", "n_max"),
    [
        (tg.write_dspark_drafter, "draft-dspark", 4),
        (tg.write_dflash_drafter, "draft-dflash", 3),  # DFlash drafts at most block_size - 1
    ],
)
def test_server_speculates_with_drafter(tmp_path, llama_server, writer, kind, n_max):
    target = tg.write_target(tmp_path / "t.gguf")
    drafter = writer(tmp_path / "d.gguf", block_size=4)
    with tg.serve(llama_server, _spec_args(target, drafter, kind, n_max), tmp_path / "s.log") as srv:
        out = srv.completion(n_predict=8)
        log = srv.log()
    assert out["timings"]["predicted_n"] == 8
    assert out["timings"].get("draft_n", 0) > 0, log[-3000:]
    assert SPEC_FAILED not in log
    assert f"adding speculative implementation '{kind}'" in log


@pytest.mark.server
def test_constant_pair_is_lossless_with_full_acceptance(tmp_path, llama_server):
    target = tg.write_target(tmp_path / "t.gguf", constant_token=7)
    drafter = tg.write_dspark_drafter(tmp_path / "d.gguf", constant_token=7)
    with tg.serve(llama_server, ["-m", target, "-np", "1", "-c", "4096"], tmp_path / "plain.log") as srv:
        plain = srv.completion(n_predict=8)
    with tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "spec.log") as srv:
        spec = srv.completion(n_predict=8)
        assert SPEC_FAILED not in srv.log()
    assert plain["content"] == spec["content"] == "7" * 8
    timings = spec["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"]


@pytest.mark.server
def test_constant_drafter_borrowing_the_head_drafts_the_targets_token(tmp_path, llama_server):
    """borrow_head: no token_embd/output in the drafter, so it drafts with the target's head. Its
    own constant (7) would be rejected by a target of constant 9: only the borrowed head
    makes every draft right."""
    target = tg.write_target(tmp_path / "t.gguf", constant_token=9)
    drafter = tg.write_dspark_drafter(tmp_path / "d.gguf", constant_token=7, borrow_head=True)
    names = {t.name for t in GGUFReader(drafter).tensors}
    assert "fc.weight" in names and not names & {"token_embd.weight", "output.weight"}
    with tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "spec.log") as srv:
        spec = srv.completion(n_predict=8)
        assert SPEC_FAILED not in srv.log()
    assert spec["content"] == "9" * 8
    timings = spec["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"]


@pytest.mark.server
def test_server_refuses_legacy_drafter_at_load(tmp_path, llama_server):
    target = tg.write_target(tmp_path / "t.gguf")
    drafter = tg.write_dspark_drafter(tmp_path / "d.gguf", legacy=True)
    with (
        pytest.raises(tg.ServerExited) as exc,
        tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "s.log"),
    ):
        pass
    assert "unknown model architecture: 'dspark'" in exc.value.log
    assert "failed to load draft model" in exc.value.log
    assert exc.value.returncode != 0


@pytest.mark.server
def test_server_refuses_drafter_at_runtime_and_keeps_serving(tmp_path, llama_server):
    target = tg.write_target(tmp_path / "t.gguf")
    drafter = tg.write_runtime_refused_drafter(tmp_path / "d.gguf")
    args = [*_spec_args(target, drafter), *tg.RUNTIME_REFUSED_ARGS]
    with tg.serve(llama_server, args, tmp_path / "s.log") as srv:
        out = srv.completion(n_predict=8)
        log = srv.log()
    assert f"{SPEC_FAILED}: DSpark draft has no confidence head" in log
    assert out["timings"]["predicted_n"] == 8
    assert out["timings"].get("draft_n", 0) == 0


@pytest.mark.server
def test_runtime_refusal_through_the_environment(tmp_path, llama_server):
    target = tg.write_target(tmp_path / "t.gguf")
    drafter = tg.write_runtime_refused_drafter(tmp_path / "d.gguf")
    with tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "s.log", env=tg.RUNTIME_REFUSED_ENV) as srv:
        out = srv.completion(n_predict=4)
        assert tg.RUNTIME_REFUSED_LOG in srv.log()
    assert out["timings"]["predicted_n"] == 4 and "draft_n" not in out["timings"]


@pytest.mark.server
def test_runtime_refused_drafter_works_without_p_min(tmp_path, llama_server):
    target = tg.write_target(tmp_path / "t.gguf")
    drafter = tg.write_runtime_refused_drafter(tmp_path / "d.gguf")
    with tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "s.log") as srv:
        out = srv.completion(n_predict=8)
        assert SPEC_FAILED not in srv.log()
    assert out["timings"]["draft_n"] > 0


@pytest.mark.server
def test_server_auto_detects_dspark(tmp_path, llama_server):
    target = tg.write_target(tmp_path / "t.gguf")
    drafter = tg.write_dspark_drafter(tmp_path / "d.gguf")
    args = ["-m", target, "-md", drafter, "--spec-draft-n-max", "4", "-np", "1", "-c", "4096"]
    with tg.serve(llama_server, args, tmp_path / "s.log") as srv:
        out = srv.completion(n_predict=8)
        assert "auto-detected speculative type 'draft-dspark'" in srv.log()
    assert out["timings"]["draft_n"] > 0


@pytest.mark.server
@pytest.mark.parametrize(
    "kwargs",
    [{"omit_block_size": True}, {"target_layers": (5,)}, {"target_embedding": 32}],
    ids=["no-block-size", "layer-id-above", "embedding"],
)
def test_server_aborts_on_pairs_check_pair_rejects(tmp_path, llama_server, kwargs):
    """Why the launcher checks pairs first: llama-server dies on these instead of refusing them."""
    target = tg.write_target(tmp_path / "t.gguf", layers=2)
    drafter = tg.write_dspark_drafter(tmp_path / "d.gguf", **kwargs)
    assert check_pair(inspect_gguf(target), inspect_gguf(drafter))
    with (
        pytest.raises(tg.ServerExited) as exc,
        tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "s.log"),
    ):
        pass
    assert "GGML_ASSERT" in exc.value.log
    assert exc.value.returncode != 0


@pytest.mark.server
@pytest.mark.parametrize("kwargs", [{"tokens_like_target": False}, {"vocab": 256}], ids=["texts", "size"])
def test_server_does_not_notice_a_vocabulary_mismatch(tmp_path, llama_server, kwargs):
    """Only check_pair catches these: the server drafts with the wrong vocabulary."""
    target = tg.write_target(tmp_path / "t.gguf")
    drafter = tg.write_dspark_drafter(tmp_path / "d.gguf", **kwargs)
    assert check_pair(inspect_gguf(target), inspect_gguf(drafter))
    with tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "s.log") as srv:
        out = srv.completion(n_predict=8)
        assert SPEC_FAILED not in srv.log()
    assert out["timings"]["draft_n"] > 0


@pytest.mark.server
def test_server_dies_on_first_request_when_a_layer_id_equals_the_layer_count(tmp_path, llama_server):
    """set_embeddings_layer_inp accepts lid <= n_layer, so the server comes up; the first
    completion then asserts "layer input tensor is null" and the process aborts."""
    target = tg.write_target(tmp_path / "t.gguf", layers=2)
    drafter = tg.write_dspark_drafter(tmp_path / "d.gguf", target_layers=(2,))
    assert check_pair(inspect_gguf(target), inspect_gguf(drafter))
    with tg.serve(llama_server, _spec_args(target, drafter), tmp_path / "s.log") as srv:
        with pytest.raises(OSError):  # the connection drops (URLError / RemoteDisconnected)
            srv.completion(n_predict=8)
        assert srv.process.wait(timeout=30) != 0
        assert "layer input tensor is null" in srv.log()


def test_a_request_that_times_out_says_so_with_the_servers_log(tmp_path):
    """A silent server (accepts, never answers) gives a TimeoutError carrying the log's tail: a
    CI failure must show whether llama-server was computing and how fast, not only a socket trace."""
    import socket

    log = tmp_path / "server.log"
    log.write_text("slot launch_slot_: id  0 | task 0 | processing task\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        server = tg.TinyServer(url=f"http://127.0.0.1:{port}", process=None, log_path=log, request_timeout=0.2)  # type: ignore[arg-type]
        with pytest.raises(TimeoutError, match=r"(?s)POST /completion: no answer in 0.2 s.*task 0 \| processing task"):
            server.completion([1, 2], n_predict=4)
