"""Tiny random-weight GGUF models for tests: targets, DSpark/DFlash drafters and broken files.

Every writer returns the Path it wrote, writes to a temporary name first and renames it into
place, and produces a file of a few hundred KB that llama-server (upstream b11434) loads in
milliseconds. Keys and tensor names follow src/llama-model.cpp, src/models/{qwen3,llama,dflash}.cpp
and src/llama-vocab.cpp of that build (the project's reference notes on the drafter GGUF layout).

Vocabulary: the `"test"` tokenizer (hash tokenizer, no BOS/EOS, so generation runs to
n_predict; a token detokenizes to its id in hex). Token texts are f"{token_prefix}{i}", so a
target and a drafter built with the same vocab size and prefix have the same token list (same
fingerprint for `bonsai_launch.models.gguf.check_pair`); another prefix gives a same-size list
with different texts, for mismatch tests.

Deterministic pairs: `constant_token=k` makes a model always predict k. Every token embeds to
the same constant vector, the attention output and FFN down projections are zero (so the
residual stream stays that vector), and the output head has a single non-zero row, k. A
constant target and a constant drafter of the same k accept every draft: speculation is live
and lossless, and its output equals a plain run.

What llama-server b11434 does with these files (each point is checked by tests/test_tiny_gguf.py):
- write_target (qwen3 or llama): loads; /completion at temperature 0 answers n_predict tokens;
  /v1/chat/completions works with or without chat_template (the server falls back to chatml).
- write_dspark_drafter with `-md FILE --spec-type draft-dspark --spec-draft-n-max <block>`:
  loads, logs "adding speculative implementation 'draft-dspark'", and a completion's timings
  report draft_n > 0. Without --spec-type the server auto-detects draft-dspark from the
  markov_w1 tensor ("auto-detected speculative type 'draft-dspark' from the draft model
  metadata").
- write_dflash_drafter (no Markov head) with `--spec-type draft-dflash`: loads and drafts;
  DFlash drafts at most block_size - 1 tokens (DSpark block_size).
- Refused at load, the server exits with status 1 before /health is ever 200:
  legacy=True ("dspark" architecture): "error loading model: unknown model architecture:
  'dspark'", "failed to load draft model, '<path>'", "exiting due to model loading error".
- Crashes (GGML_ASSERT, SIGABRT, exit status 134) while loading, before /health is 200:
  omit_block_size=True ("DSpark draft requires 'dflash.block_size' in GGUF metadata"), a
  target layer id above the target's layer count ("GGML_ASSERT(lid <= model.hparams.n_layer())"),
  an embedding size other than the target's ("GGML_ASSERT(ggml_can_mul_mat(a, b))").
- A target layer id EQUAL to the target's layer count passes that assert: the server comes
  up healthy, then aborts on the first completion ("GGML_ASSERT(t_layer_inp[il] != nullptr &&
  "layer input tensor is null")"); the client sees the connection drop.
- NOT refused at all: a drafter whose token texts differ from the target's, or whose
  vocabulary is smaller, serves and drafts happily (draft-dflash/draft-dspark never compare
  vocabularies; only draft-simple does). check_pair is the only guard for those.
- Refused at runtime while the server keeps serving: write_runtime_refused_drafter's file
  (a DSpark drafter declaring `dflash.has_confidence_head = false`) when the server also gets
  a positive draft p-min (RUNTIME_REFUSED_ARGS `--spec-draft-p-min 0.5`, or the environment
  RUNTIME_REFUSED_ENV `LLAMA_ARG_SPEC_DRAFT_P_MIN=0.5`). Both models load, then the server
  logs "srv    load_model: failed to initialize speculative decoding context: DSpark draft
  has no confidence head: please set --spec-draft-p-min 0", /health turns 200 and
  completions run without speculation (timings carry no draft_n). No drafter file on its own
  (with the launcher's usual flags) makes b11434 fail speculation init this softly: the
  DSpark/DFlash init throws only for that p-min case; everything else aborts or exits.
- The log always shows "failed to initialize the context: dflash requires ctx_other to be
  set (this warning is normal during memory fitting)" for a dflash drafter: harmless.

Log-SNR family (`log_snr=LogSnr(...)` or `log_snr=True`): the keys dflash.log_snr_conditioning,
dflash.min_log_snr and dflash.max_log_snr plus the tensors log_snr_fc1/fc2 (weight, bias) of
PrismML's Bonsai drafters. Only our patched build (vendor/llama.cpp/patches/0002-*) loads
them ("DFlash with DSpark log-SNR conditioning (min -9.000, max 9.000)"); stock b11434 refuses
the file ("wrong number of tensors; expected N, got N-4"). tests/test_log_snr.py checks the
loader's refusals and, with tests/support/log_snr_ref.py, the conditioning maths.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bonsai_launch.models import tiny_writer as tw  # the writer the self-test ships with (no copy here)
from bonsai_launch.models.tiny_dense import _layer_tensors  # the dense target the self-test
from bonsai_launch.models.tiny_dense import write_target as write_target  # ships with, re-exported

# Extra server arguments that make llama-server refuse write_runtime_refused_drafter's file
# at runtime (it loads, then speculation initialization fails and the server serves without it).
RUNTIME_REFUSED_ARGS = ("--spec-draft-p-min", "0.5")
RUNTIME_REFUSED_ENV = {"LLAMA_ARG_SPEC_DRAFT_P_MIN": "0.5"}  # the same, for an unchanged argv
RUNTIME_REFUSED_LOG = (
    "failed to initialize speculative decoding context: "
    "DSpark draft has no confidence head: please set --spec-draft-p-min 0"
)


LOG_SNR_TENSORS = ("log_snr_fc1.weight", "log_snr_fc1.bias", "log_snr_fc2.weight", "log_snr_fc2.bias")
LOG_SNR_FEATURES = 128  # 64 sin + 64 cos features of the row's noise level


@dataclass(frozen=True)
class LogSnr:
    """The log-SNR family's keys and tensors for a drafter. Every part can be left out or
    bent, so tests can write the files the patched loader must refuse.

    flag/min_log_snr/max_log_snr: the key values (None leaves the key out). tensors: which of
    LOG_SNR_TENSORS to write. weights: explicit values by tensor name, numpy layout
    (fc1.weight (E, 128), fc2.weight (E, E), biases (E,)); the rest are random.
    """

    flag: bool | None = True
    min_log_snr: float | None = -9.0
    max_log_snr: float | None = 9.0
    tensors: tuple[str, ...] = LOG_SNR_TENSORS
    weights: Mapping[str, np.ndarray] = field(default_factory=dict)

    def kv(self, prefix: str) -> list[tuple[str, str, object]]:
        out: list[tuple[str, str, object]] = []
        if self.flag is not None:
            out.append(("bool", f"{prefix}.log_snr_conditioning", self.flag))
        if self.min_log_snr is not None:
            out.append(("float32", f"{prefix}.min_log_snr", self.min_log_snr))
        if self.max_log_snr is not None:
            out.append(("float32", f"{prefix}.max_log_snr", self.max_log_snr))
        return out

    def tensor_list(self, rng: np.random.Generator, embedding: int) -> list[tuple[str, np.ndarray]]:
        shapes = {
            "log_snr_fc1.weight": (LOG_SNR_FEATURES, embedding),
            "log_snr_fc1.bias": (embedding,),
            "log_snr_fc2.weight": (embedding, embedding),
            "log_snr_fc2.bias": (embedding,),
        }
        unknown = set(self.weights) - set(shapes)
        if unknown:
            raise ValueError(f"not log-SNR tensors: {sorted(unknown)}")
        out = []
        for name in LOG_SNR_TENSORS:  # drawn in a fixed order, so a dropped tensor changes no other
            data = tw.rand(rng, *shapes[name])
            if name in self.weights:
                data = np.asarray(self.weights[name], dtype=np.float32)
                if data.shape != tuple(reversed(shapes[name])):
                    raise ValueError(f"{name}: numpy shape {data.shape}, expected {tuple(reversed(shapes[name]))}")
            if name in self.tensors:
                out.append((name, data))
        return out


def _write_drafter(
    path: str | Path,
    *,
    markov: bool,
    target_embedding: int = 64,
    target_layers: Sequence[int] = (1,),
    vocab: int = 512,
    block_size: int = 4,
    mask_token_id: int | None = None,
    draft_layers: int = 1,
    seed: int = 0,
    constant_token: int | None = None,
    borrow_head: bool = False,
    legacy: bool = False,
    omit_block_size: bool = False,
    markov_rank: int = 8,
    tokens_like_target: bool = True,
    token_prefix: str | None = None,
    heads: int = 4,
    heads_kv: int = 2,
    head_dim: int = 16,
    ff: int = 128,
    context_length: int = 32768,
    has_confidence_head: bool | None = None,
    confidence_head: bool = False,
    name: str = "tiny-dspark",
    log_snr: LogSnr | bool | None = None,
    tensor_overrides: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """The one drafter writer: DSpark (markov=True) and plain DFlash share all but the Markov head."""
    token_prefix = token_prefix or (tw.DEFAULT_TOKEN_PREFIX if tokens_like_target else "other")
    if log_snr is True:
        log_snr = LogSnr()
    log_snr = log_snr or None
    arch = "dspark" if legacy else "dflash"
    e = target_embedding
    mask = vocab - 1 if mask_token_id is None else mask_token_id
    rng = tw.rng(seed)
    kv: list[tuple[str, str, object]] = [("string", "general.name", name)]
    kv += tw.attention_kv(
        arch,
        context_length=context_length,
        embedding=e,
        layers=draft_layers,
        ff=ff,
        heads=heads,
        heads_kv=heads_kv,
        head_dim=head_dim,
    )
    layer_ids = [int(i) for i in target_layers]
    if legacy:
        # the PrismML fork's layout: the DSpark settings live under "dspark.dspark."
        kv.append(("array", "dspark.dspark.target_layers", layer_ids))
        if not omit_block_size:
            kv.append(("uint32", "dspark.dspark.block_size", block_size))
    else:
        kv.append(("array", "dflash.target_layers", layer_ids))
        if not omit_block_size:
            kv.append(("uint32", "dflash.block_size", block_size))
        kv.append(("bool", "dflash.sample_from_anchor", True))
    if has_confidence_head is not None:
        kv.append(("bool", f"{arch}.has_confidence_head", has_confidence_head))
    if log_snr is not None:
        kv += log_snr.kv("dspark.dspark" if legacy else "dflash")
    kv += tw.tokenizer_kv(vocab, "test", token_prefix, None, mask_token_id=mask)

    n_in = len(layer_ids) * e
    tensors: list[tuple[str, np.ndarray]] = [
        ("fc.weight", tw.rand(rng, n_in, e)),
        ("enc.output_norm.weight", tw.ones(e)),
        ("output_norm.weight", tw.ones(e)),
    ]
    if constant_token is not None and not borrow_head:
        # its own embeddings and head, so it drafts k whatever the target is
        embd, out = tw.constant_head(e, vocab, constant_token)
        tensors += [("token_embd.weight", embd), ("output.weight", out)]
    # otherwise token_embd/output are borrowed from the target, like the real drafters: a
    # constant drafter's residual stream is then the target's (constant) embedding, and the
    # target's constant head scores its own token highest for it, so every draft is accepted
    if markov:
        w2 = tw.zeros(markov_rank, vocab) if constant_token is not None else tw.rand(rng, markov_rank, vocab)
        tensors += [("markov_w1.weight", tw.rand(rng, markov_rank, vocab)), ("markov_w2.weight", w2)]
        if confidence_head:
            tensors += [("conf_proj.weight", tw.rand(rng, e + markov_rank, 1)), ("conf_proj.bias", tw.zeros(1))]
    for i in range(draft_layers):
        tensors += _layer_tensors(
            rng,
            i,
            embedding=e,
            ff=ff,
            heads=heads,
            heads_kv=heads_kv,
            head_dim=head_dim,
            qk_norm=True,
            constant=constant_token is not None,
        )
    if log_snr is not None:
        tensors += log_snr.tensor_list(rng, e)
    if tensor_overrides:
        missing = set(tensor_overrides) - {n for n, _ in tensors}
        if missing:
            raise ValueError(f"tensor_overrides names tensors this drafter does not have: {sorted(missing)}")
        tensors = [(n, tensor_overrides.get(n, data)) for n, data in tensors]
    return tw.write(path, arch, kv, tensors)


def write_dspark_drafter(path: str | Path, **options: Any) -> Path:
    """A DSpark drafter: architecture `dflash` plus markov_w1/markov_w2.

    Options (keyword, with the defaults of _write_drafter): target_embedding, target_layers,
    vocab, block_size, mask_token_id, draft_layers, seed, constant_token, omit_block_size,
    markov_rank, heads, heads_kv, head_dim, ff, context_length, name, and:
    legacy=True writes the PrismML fork's `general.architecture = "dspark"` form (block size
    under `dspark.dspark.block_size`), which upstream llama.cpp cannot load. tokens_like_target
    =False (or another token_prefix) gives a same-size vocabulary with different token texts.
    confidence_head=True adds conf_proj tensors; has_confidence_head sets the metadata flag.
    log_snr=True (or a LogSnr) writes the log-SNR family's keys and tensors (random weights
    unless given). tensor_overrides replaces tensors by name (numpy layout), e.g. the
    conditioning fixture's token_embd/output. borrow_head=True with constant_token writes no
    token_embd/output, as the real drafters (they read the target's): against a constant
    target it drafts the target's token, whatever constant_token says, so every draft is
    accepted and the drafter's LM head pass costs what the target's head costs (the benchmarks'
    every-matrix-Q1_0 head).
    """
    return _write_drafter(path, markov=True, **options)


# What only a DSpark drafter has: a plain DFlash drafter refuses these options.
_DSPARK_ONLY = ("legacy", "markov_rank", "confidence_head", "has_confidence_head", "log_snr")


def write_dflash_drafter(path: str | Path, **options: Any) -> Path:
    """A plain DFlash drafter (no Markov head; llama-server's kind draft-dflash); the options of
    write_dspark_drafter but those of its Markov head, confidence head and legacy form."""
    refused = sorted(set(options) & set(_DSPARK_ONLY))
    if refused:
        raise TypeError(f"a DFlash drafter has no {', '.join(refused)} (write_dspark_drafter has)")
    options.setdefault("name", "tiny-dflash")
    return _write_drafter(path, markov=False, markov_rank=0, **options)


def write_runtime_refused_drafter(path: str | Path, **kwargs) -> Path:
    """A DSpark drafter llama-server loads but then refuses at runtime when started with
    RUNTIME_REFUSED_ARGS (`--spec-draft-p-min 0.5`): it declares no confidence head, so
    speculation init fails ("failed to initialize speculative decoding context: DSpark draft
    has no confidence head: please set --spec-draft-p-min 0") and the server serves without it."""
    kwargs.setdefault("name", "tiny-dspark-no-confidence")
    return write_dspark_drafter(path, has_confidence_head=False, confidence_head=False, **kwargs)


def truncate(path: str | Path, keep_bytes: int) -> Path:
    """Cut an existing file down to its first keep_bytes bytes (a half-downloaded model)."""
    path = Path(path)
    with path.open("r+b") as fh:
        fh.truncate(keep_bytes)
    return path


def write_not_gguf(path: str | Path, content: bytes = b"<html>404 Not Found</html>\n" * 4) -> Path:
    """A file with a .gguf name that is not GGUF (an error page saved by a download)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tw.tmp_name(path)
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return path


# --- running a tiny model in the real llama-server (for tests) ---------------------------------


@dataclass
class TinyServer:
    """A llama-server started by `serve`: its base URL, process and log file."""

    url: str
    process: subprocess.Popen
    log_path: Path
    request_timeout: float = 60.0  # seconds per request

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout) as resp:
                return json.load(resp)
        except TimeoutError as e:
            # the server's own account (was it computing, and how fast?) is what a failure needs
            raise TimeoutError(
                f"POST {path}: no answer in {self.request_timeout:g} s; llama-server's log ends:\n{self.log()[-3000:]}"
            ) from e

    def completion(self, prompt: str = "hello world", n_predict: int = 8, **extra: object) -> dict:
        """POST /completion at temperature 0; the answer's `timings` has draft_n when speculating."""
        return self.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0, **extra})


def offloaded_layers(log: str) -> list[tuple[int, int]]:
    """(offloaded, total) layers of each model a llama-server log shows loaded, in load order
    (the target first); the memory-fitting pass's dry loads (`load_mode = none`) are left out."""
    loads, dry = [], False
    for line in log.splitlines():
        if mode := re.search(r"load_mode = (\w+)", line):
            dry = mode.group(1) == "none"
        elif (done := re.search(r"offloaded (\d+)/(\d+) layers to GPU", line)) and not dry:
            loads.append((int(done.group(1)), int(done.group(2))))
    return loads


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerExited(RuntimeError):
    """llama-server ended before it became healthy; `log` holds what it printed."""

    def __init__(self, returncode: int | None, log: str) -> None:
        super().__init__(f"llama-server exited ({returncode}) before /health said 200:\n{log[-3000:]}")
        self.returncode = returncode
        self.log = log


@contextlib.contextmanager
def serve(
    binary: str | Path,
    args: Sequence[str],
    log_path: str | Path,
    *,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    request_timeout: float = 60.0,
) -> Iterator[TinyServer]:
    """Run `binary args --host 127.0.0.1 --port <free>` until /health answers 200; always kill it.

    Raises ServerExited if the process ends first (a refused model), TimeoutError otherwise.
    `env` adds variables to the inherited environment; `request_timeout` bounds each request
    (a software GPU compiles its shaders at their first use).
    """
    log_path = Path(log_path)
    port = free_port()
    argv = [str(binary), *map(str, args), "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise ServerExited(proc.returncode, log_path.read_text(errors="replace"))
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass  # not listening yet, or 503 while loading
            if time.monotonic() > deadline:
                raise TimeoutError(f"llama-server not healthy after {timeout}s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        yield TinyServer(url=url, process=proc, log_path=log_path, request_timeout=request_timeout)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
