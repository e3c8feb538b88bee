"""One liveness rule for start, run, chat, verify and bench: live only when the probe drafted.

A stand-in llama-server (a few lines of Python) answers /slots, /completion and /tokenize so
every combination of "/slots says speculative true/false/absent" x "the probe drafted 0 or
more" x "an n-gram type or a drafter" is checked against `speculation_probe`, the
supervisor's proof and `verify`. The real llama-server then shows that `bonsai start` and
`bonsai verify` agree about the same server, live and not live.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import bench_options
import tiny_gguf
from bonsai_launch.models import tiny_hybrid
from bonsai_launch.server import liveness as speculation_probe
from bonsai_launch.server.plan import SpecPlan
from bonsai_launch.server.process import free_port
from bonsai_launch.server.supervisor import prove_speculation
from bonsai_launch.server.verify import verify
from start_helpers import bonsai, json_out, stop_all


class StandIn:
    """What the stand-in answers: `slots` True/False/None (404), and the draft counts of the
    first probe request and of the echo request."""

    def __init__(self, slots: bool | None, first_drafted: int, echo_drafted: int = 0) -> None:
        self.slots = slots
        self.first_drafted = first_drafted
        self.echo_drafted = echo_drafted
        self.completions: list[dict] = []


def _handler(state: StandIn):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, code: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/slots" and state.slots is not None:
                self._json(200, [{"id": 0, "speculative": state.slots}])
            elif self.path == "/props":
                self._json(200, {"build_info": "stand-in", "model_path": "m.gguf"})
            elif self.path == "/v1/models":
                self._json(200, {"data": [{"id": "m.gguf"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                self._json(200, {"tokens": list(range(10))})
            elif self.path == "/completion":
                state.completions.append(body)
                echo = isinstance(body["prompt"], list)
                drafted = state.echo_drafted if echo else state.first_drafted
                timings = {"predicted_n": body["n_predict"], "predicted_per_second": 100.0}
                if drafted:
                    timings.update(draft_n=drafted, draft_n_accepted=drafted // 2)
                self._json(200, {"content": "x", "tokens": [1, 2, 3], "timings": timings})
            else:
                self._json(404, {"error": "not found"})

    return Handler


@pytest.fixture
def stand_in():
    servers = []

    def make(state: StandIn) -> str:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield make
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


SPEC_TYPES = {"ngram": SpecPlan("ngram-mod", None), "drafter": SpecPlan("draft-dspark", 4, drafter="d.gguf")}


@pytest.mark.parametrize("slots, drafted, kind", list(itertools.product([True, False, None], [0, 6], SPEC_TYPES)))
@pytest.mark.slow
def test_live_only_when_the_probe_drafted(stand_in, slots, drafted, kind):
    url = stand_in(StandIn(slots, drafted))
    proof = prove_speculation(url, SPEC_TYPES[kind])
    report = verify(url, expect_speculative=True)
    assert proof.live is (drafted > 0)
    assert report.speculative is proof.live  # verify and start judge alike
    assert report.ok is proof.live
    assert proof.drafted == report.drafted == drafted
    if proof.live:
        assert proof.reason is None and "speculative decoding: live" in proof.summary()
    else:
        assert proof.summary().startswith(f"speculative decoding: NOT live ({SPEC_TYPES[kind].spec_type}): ")
        assert proof.reason in report.problems[0] or report.not_live_reason in proof.reason
        if slots is False:
            assert "no draft context" in proof.reason


def test_echo_request_counts_and_is_skipped_without_a_draft_context(stand_in):
    state = StandIn(True, first_drafted=0, echo_drafted=9)
    proof = prove_speculation(stand_in(state), SPEC_TYPES["ngram"])
    assert proof.live and proof.drafted == 9
    first, echo = state.completions
    assert first["prompt"] == speculation_probe.PROOF_PROMPT and first["temperature"] == 0
    # P O P O P as token ids: the prompt's tokens and the model's answer, repeated
    assert echo["prompt"] == list(range(10)) + [1, 2, 3] + list(range(10)) + [1, 2, 3] + list(range(10))

    dead = StandIn(False, first_drafted=0, echo_drafted=9)
    assert not prove_speculation(stand_in(dead), SPEC_TYPES["ngram"]).live
    assert len(dead.completions) == 1


def test_proof_names_the_number_not_default():
    proof = speculation_probe.SpecProof(True, "ngram-mod", None, drafted=10, accepted=5, slots_speculative=True)
    assert "n-max 64 (llama.cpp default)" in proof.summary()
    assert "default" not in speculation_probe.SpecProof(True, "draft-dspark", 7, 7, 7, True).summary()
    assert proof.to_json()["n_max_effective"] == 64


# -- the real llama-server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {
        "target": tiny_gguf.write_target(d / "target.gguf"),
        "const": tiny_gguf.write_target(d / "c.gguf", constant_token=7),
        # a hybrid (qwen35) target, as every Bonsai 27B: the rollback of its recurrent state
        "hybrid": tiny_hybrid.write_hybrid_target(d / "h.gguf", mode="counter", weight_type="q8_0"),
    }


@pytest.fixture
def cleanup():
    yield
    stop_all()


NGRAM_TYPES = ("ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache")


@pytest.mark.server
@pytest.mark.parametrize("model", ["target", "const", "hybrid"])
@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
@pytest.mark.slow
def test_every_ngram_type_drafts_on_the_probe_and_verify_agrees(llama_server, tiny, cleanup, spec_type, model):
    started = json_out(
        bonsai(
            [
                "start",
                "--model",
                tiny[model],
                "--port",
                free_port(),
                "--ctx",
                "2048",
                "--speculative",
                "--spec-type",
                spec_type,
                "--detach",
                "--json",
            ],
            server=llama_server,
        )
    )
    spec = started["speculative"]
    assert spec["live"] and spec["drafted"] > 0, spec
    report = json_out(
        bonsai(["verify", "--url", started["url"], "--json", "--expect-speculative"], server=llama_server)
    )
    assert report["speculative"] is True and report["drafted"] > 0


@pytest.mark.server
@pytest.mark.slow
def test_start_and_verify_agree_when_nothing_is_drafted(llama_server, tiny, cleanup):
    """An n-gram type whose lookup can never match (n-gram size 256): /slots says speculative,
    nothing is drafted, so start refuses, --spec-fallback warns, and verify says the same."""
    args = [
        "start",
        "--model",
        tiny["target"],
        "--port",
        free_port(),
        "--ctx",
        "2048",
        "--speculative",
        "--spec-type",
        "ngram-simple",
    ]
    never = ["--", "--spec-ngram-simple-size-n", "256"]
    refused = bonsai([*args, *never], server=llama_server)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "speculative decoding: NOT live (ngram-simple): the probe drafted no tokens" in refused.stderr
    assert "--spec-fallback" in refused.stderr

    kept = bonsai([*args, "--spec-fallback", "--detach", "--json", *never], server=llama_server)
    spec = json_out(kept)["speculative"]
    assert spec["live"] is False and spec["drafted"] == 0 and spec["slots_speculative"] is True
    assert "warning: speculative decoding: NOT live" in kept.stderr
    checked = bonsai(["verify", "--expect-speculative"], server=llama_server)
    assert checked.returncode == 1
    assert f"NOT live: {spec['reason']}" in checked.stdout


@pytest.mark.server
def test_block_7_drafter_sets_n_max_7_and_drafts(llama_server, tiny, cleanup, tmp_path):
    drafter = tiny_gguf.write_dspark_drafter(tmp_path / "block7.gguf", block_size=7)
    started = json_out(
        bonsai(
            [
                "start",
                "--model",
                tiny["target"],
                "--drafter",
                drafter,
                "--port",
                free_port(),
                "--ctx",
                "2048",
                "--speculative",
                "--detach",
                "--json",
            ],
            server=llama_server,
        )
    )
    spec = started["speculative"]
    assert spec["type"] == "draft-dspark" and spec["n_max"] == 7 and spec["live"] and spec["drafted"] > 0
    argv = started["plan"]["argv"]
    assert argv[argv.index("--spec-draft-n-max") + 1] == "7"


@pytest.mark.server
def test_bench_refuses_to_measure_a_speculative_configuration_that_does_not_draft(llama_server, tiny, tmp_path):
    from bonsai_launch.bench.pipeline import Target, run_bench
    from bonsai_launch.core.errors import ActionFailed

    options = bench_options.one_pass(("plain", "ngram-simple"), categories=("code",), per_category=1, max_tokens=8)
    target = Target(
        model=str(tiny["target"]), binary=llama_server, passthrough=("-t", "1", "--spec-ngram-simple-size-n", "256")
    )
    with pytest.raises(ActionFailed) as err:
        run_bench(options, target, tmp_path / "out", chart=False)
    assert (
        "ngram-simple: speculative decoding: NOT live (ngram-simple): the probe drafted no tokens" in err.value.message
    )


@pytest.mark.server
@pytest.mark.slow
def test_every_ngram_type_drafts_on_the_probe_with_the_demo_model(llama_server, demo_gguf, tmp_path):
    """The real (Q4_K) demo model: the probe's first request already drafts for every type."""
    for spec_type in NGRAM_TYPES:
        args = [
            "-m",
            demo_gguf,
            "--spec-type",
            spec_type,
            "-c",
            "4096",
            "-np",
            "1",
            "--no-jinja",
            "--chat-template",
            "gemma",
        ]
        with tiny_gguf.serve(llama_server, args, tmp_path / f"{spec_type}.log", timeout=120) as server:
            result = speculation_probe.probe(server.url)
            assert speculation_probe.is_live(result), (spec_type, result)
            assert result.requests == 1 and result.accepted > 0, (spec_type, result)
