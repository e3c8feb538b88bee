"""The settings registry: every BONSAI_* variable, its type, default and meaning.

One table drives parsing, `bonsai config`, the environment_variables.md check and the
error messages. Precedence, highest first: CLI flag > environment > profile > detected
default. A value that cannot be parsed is never ignored: it raises BonsaiError naming the
variable, the value and what is allowed (exit code 2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from bonsai_launch.core.errors import BonsaiError

Kind = Literal["bool", "int", "str", "choice", "path", "secret"]
Source = Literal["flag", "passthrough", "env", "profile", "default", "detected"]  # passthrough: after `--`

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

# In the order llama-server (b11434) tries them when several are given (common_speculative_init:
# the n-gram lookups first, then the one draft model): a combination is written in this order.
SPEC_TYPES = (
    "none",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
)


@dataclass(frozen=True)
class Setting:
    """One BONSAI_* variable. `key` is the name used by flags, profiles and the plan."""

    env: str
    key: str
    kind: Kind
    description: str
    commands: tuple[str, ...]
    default: Any = None
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    default_text: str = ""  # how the default reads in docs when it is detected, not fixed
    auto: bool = False  # a bool that also accepts "auto" (decided later, e.g. from measurements)
    refused: tuple[tuple[str, str], ...] = ()  # (value, why): known values that are refused, with the reason
    combined: bool = False  # a choice that also takes several choices joined by commas (kept in choices' order)

    def allowed(self) -> str:
        """What values are accepted, in words, for error messages and the docs."""
        if self.kind == "bool":
            return "1/0, true/false, yes/no, on/off (any case)" + (", or auto" if self.auto else "")
        if self.kind == "int":
            return f"a whole number from {self.minimum} to {self.maximum}"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices) + ("; or several joined by commas" if self.combined else "")
        if self.kind == "path":
            return "a file or folder path"
        return "any text"


# The sizes each family of the built-in catalog comes in, for help texts and the choices below
# (tests/test_profiles.py checks it against profiles/).
FAMILY_SIZES: dict[str, tuple[str, ...]] = {
    "ternary": ("27B", "8B", "4B", "1.7B"),
    "bonsai": ("27B", "8B", "4B", "1.7B"),
    "bonsai2": ("27B", "9B", "4B", "2B"),
    "bonsai2.5": ("27B",),
}


def family_sizes_text(sep: str = ": ", join: str = "; ") -> str:
    """`ternary: 27B, 8B, 4B, 1.7B; bonsai: ...`: which sizes exist, for help texts."""
    return join.join(f"{family}{sep}{', '.join(sizes)}" for family, sizes in FAMILY_SIZES.items())


_START = ("start", "serve", "run", "bench", "config")
_SLOTS = ("start", "run", "chat", "bench", "config")
_PULL = ("pull", "start", "run", "models")

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "BONSAI_PROFILE",
        "profile",
        "str",
        "Profile to use (overrides BONSAI_FAMILY/BONSAI_MODEL), e.g. ternary-27b, bonsai-8b, demo.",
        _START + ("pull", "models", "rm"),
        default_text="<family>-<size>",
    ),
    Setting(
        "BONSAI_FAMILY",
        "family",
        "choice",
        "Bonsai model family: ternary (2-bit ternary weights), bonsai (1-bit), bonsai2 (Ternary Bonsai 2) or bonsai2.5 (Ternary Bonsai 2.5); bonsai2 and bonsai2.5 run on bonsai's build (Hadamard fold, PQ2_0/PTQ1_0 repacked as Q2_0) or a PrismML fork build. With --model/BONSAI_GGUF it still picks the profile's sampling.",
        _START + ("pull",),
        default="ternary",
        choices=tuple(FAMILY_SIZES),
    ),
    Setting(
        "BONSAI_MODEL",
        "size",
        "choice",
        f"Bonsai model size within the family ({family_sizes_text()}).",
        _START + ("pull",),
        default="27B",
        choices=("27B", "9B", "8B", "4B", "2B", "1.7B"),
    ),
    Setting(
        "BONSAI_LAYOUT",
        "layout",
        "choice",
        "Which llama.cpp build to run, and so which weight files: mainline (upstream, the pinned build) or fork (PrismML's fork, `bonsai build --source prismml`).",
        _START + _PULL,
        choices=("mainline", "fork"),
        default_text="auto: mainline, or fork when the profile's weights need it",
    ),
    Setting(
        "BONSAI_LLAMA_BIN",
        "llama_bin",
        "path",
        "A folder holding llama-server (as the reference launcher's BONSAI_LLAMA_BIN); set it or BONSAI_LLAMA_SERVER, not both.",
        ("start", "run", "bench", "doctor", "config"),
        default_text="none",
    ),
    Setting(
        "BONSAI_GGUF",
        "gguf",
        "path",
        "Run this local GGUF, like --model (the flag wins); BONSAI_FAMILY/BONSAI_MODEL/BONSAI_PROFILE still choose the sampling.",
        _START,
        default_text="the profile's weights",
    ),
    Setting(
        "BONSAI_MMPROJ",
        "mmproj",
        "path",
        "Use this local vision projector GGUF, like --mmproj (the flag wins).",
        _START,
        default_text="the profile's projector",
    ),
    Setting(
        "BONSAI_REASONING_EFFORT",
        "reasoning_effort",
        "choice",
        "Reasoning effort passed through the chat template (--chat-template-kwargs) for the profiles that take one (the Bonsai 2 and 2.5 ones); medium is fastest, unset keeps the template's default (xhigh). high and low are refused: Bonsai 2's template fails on high (HTTP 500) and thinks as long as xhigh at low.",
        _START,
        choices=("medium", "xhigh"),
        default_text="the template's (xhigh)",
        refused=(
            (
                "high",
                'Bonsai 2\'s chat template answers reasoning_effort "high" with HTTP 500; medium is the fastest that works',
            ),
            ("low", "Bonsai 2's chat template thinks about as long as at xhigh with low; medium is the fastest"),
        ),
    ),
    Setting(
        "BONSAI_TOKEN",
        "token",
        "secret",
        "Hugging Face read token for private repos (else .bonsai_token, then HF_TOKEN/login).",
        _PULL,
    ),
    Setting(
        "BONSAI_HOST",
        "host",
        "str",
        "Address llama-server binds; anything but loopback needs BONSAI_ALLOW_REMOTE=1.",
        _START,
        default="127.0.0.1",
    ),
    Setting(
        "BONSAI_PORT",
        "port",
        "int",
        "Port llama-server listens on. PORT (the reference launcher's name) is read when BONSAI_PORT is unset.",
        _START,
        default=8080,
        minimum=1,
        maximum=65535,
    ),
    Setting(
        "BONSAI_CTX",
        "ctx",
        "int",
        "Context size in tokens; 0 or unset sizes it from RAM and free GPU memory (never -c 0).",
        _START,
        default=0,
        minimum=0,
        maximum=1_048_576,
        default_text="0 (auto)",
    ),
    Setting(
        "BONSAI_NGL",
        "ngl",
        "int",
        "Layers offloaded to the GPU; unset means 99 with a usable GPU, 0 on CPU.",
        _START,
        minimum=0,
        maximum=999,
        default_text="auto (99 with a GPU, 0 on CPU)",
    ),
    Setting(
        "BONSAI_IMAGE_MAX_TOKENS",
        "image_max_tokens",
        "int",
        "Cap on image tokens for the vision projector; unset means 1024 on Metal/Vulkan/CPU, uncapped on CUDA/ROCm.",
        _START,
        minimum=1,
        maximum=1_048_576,
        default_text="auto",
    ),
    Setting(
        "BONSAI_MMPROJ_CPU",
        "mmproj_cpu",
        "bool",
        "Keep the vision projector on the CPU (--no-mmproj-offload).",
        _START,
        default=False,
    ),
    Setting(
        "BONSAI_VISION",
        "vision",
        "bool",
        "Load the vision projector when the profile has one.",
        _START + ("pull",),
        default=True,
    ),
    Setting(
        "BONSAI_SPECULATIVE",
        "speculative",
        "bool",
        "Turn on speculative decoding (a drafter, else the model's own MTP layer, else the profile's draft-free n-gram mode, ngram-mod without a profile); auto: what `bonsai tune` measured to pay on this machine, else plain.",
        _START + ("chat",),
        default=False,
        auto=True,
    ),
    Setting(
        "BONSAI_SPEC_TYPE",
        "spec_type",
        "choice",
        "Speculative type; unset means what the drafter needs, draft-mtp for a model with a usable MTP layer, or the profile's draft-free type. Several types joined by commas run together (llama-server tries the n-gram lookups first, then the one draft model): ngram-mod,draft-mtp is what Bonsai 2 users without a drafter run.",
        _START,
        choices=SPEC_TYPES,
        combined=True,
        default_text="auto",
    ),
    Setting(
        "BONSAI_SPEC_NMAX",
        "spec_nmax",
        "int",
        "Draft length; with a drafter it must equal the drafter's block size (read from the GGUF); draft-mtp: 1 unless set; in a list of types, the draft model's (each n-gram type keeps its own, or all take it in a list of n-gram types only).",
        _START,
        minimum=1,
        maximum=64,
        default_text="the drafter's block size",
    ),
    Setting(
        "BONSAI_DRAFT_HEAD_ROWS",
        "draft_head_rows",
        "int",
        "With bonsai's build, how many of the LM head's first rows a draft model drafts from: draft-mtp on a "
        "qwen35 model (Bonsai 2), or a DSpark/DFlash drafter that borrows the target's head "
        "(--spec-draft-head-rows, patches 0015-0017); 0 is the whole head. Unset: 65536 where the "
        "CPU computes the head, the whole head on a GPU. A token past the cut is never drafted (answers are "
        "unchanged): text in Latin script and code keep 94-98% of their tokens in the first 65536 ids, Chinese, "
        "Japanese, Korean and Russian about 70%, so 0 can be faster there; `bonsai tune` measures both.",
        _START,
        minimum=0,
        maximum=1 << 24,
        default_text="65536 on a CPU, the whole head on a GPU",
    ),
    Setting(
        "BONSAI_KV4",
        "kv4",
        "bool",
        "4-bit KV cache (q4_0) for the target and, with speculation, the drafter.",
        _START,
        default=False,
    ),
    # Slots and the prompt cache (bonsai_launch/server/slots.py, bonsai_launch/server/prompt_cache.py).
    Setting(
        "BONSAI_PARALLEL",
        "parallel",
        "int",
        "Server slots (-np): requests served at once. Unset: 1 with speculation; "
        "without, llama-server's own default (4 slots sharing one KV pool). With speculation and more than 1, "
        "-ub/-b and the context are sized for every slot.",
        _SLOTS,
        minimum=1,
        maximum=256,
        default_text="1 with speculation, else llama-server's auto (4)",
    ),
    Setting(
        "BONSAI_KV_UNIFIED",
        "kv_unified",
        "bool",
        "With several slots, one shared KV pool (-kvu): a slot may use the "
        "whole context, all slots together cannot exceed it. Off: -c is split evenly, each slot keeps its share.",
        _SLOTS,
        default=False,
    ),
    Setting(
        "BONSAI_CACHE_RAM",
        "cache_ram",
        "int",
        "Prompt cache in RAM, MiB (--cache-ram): earlier conversations are "
        "restored instead of re-read; -1 no limit, 0 off. Unset: llama-server's default (8192 in b11434).",
        _SLOTS,
        minimum=-1,
        maximum=1_048_576,
        default_text="llama-server's (8192)",
    ),
    Setting(
        "BONSAI_CTX_CHECKPOINTS",
        "ctx_checkpoints",
        "int",
        "Context checkpoints per slot (--ctx-checkpoints): prefix "
        "reuse for hybrid/SWA models, whose cache cannot be trimmed; 0 off. Unset: llama-server's default (32).",
        _SLOTS,
        minimum=0,
        maximum=4096,
        default_text="llama-server's (32)",
    ),
    Setting(
        "BONSAI_CACHE_IDLE_SLOTS",
        "cache_idle_slots",
        "bool",
        "Save an idle slot's conversation to the prompt cache "
        "when a new one takes the slot (--cache-idle-slots; needs the RAM cache). Unset: llama-server's default (on).",
        _SLOTS,
        default_text="llama-server's (on)",
    ),
    Setting(
        "BONSAI_SLEEP_IDLE_SECONDS",
        "sleep_idle_seconds",
        "int",
        "Unload the model after this many seconds without a request (--sleep-idle-seconds): the memory goes "
        "back to the system and the next request loads it again (and the drafter) before it is answered. "
        "/health and /props answer while asleep without waking it; `bonsai ps` shows asleep or awake, and the "
        "restart keeper leaves a sleeping server alone. Unset or 0: never sleep.",
        _START,
        minimum=0,
        maximum=31_536_000,
        default_text="never sleep",
    ),
    # `bonsai serve`: one llama-server router hosting several models (server/router.py).
    Setting(
        "BONSAI_MODELS_MAX",
        "models_max",
        "int",
        "`bonsai serve`: how many models stay loaded at once (llama-server's --models-max); loading one more "
        "unloads the least recently used that is not pinned. 0: no limit.",
        ("serve",),
        default=4,
        minimum=0,
        maximum=256,
    ),
    Setting(
        "BONSAI_IDLE_UNLOAD",
        "idle_unload",
        "str",
        "`bonsai serve`: seconds without a request after which a model is unloaded and its llama-server child "
        "ends, so its memory really returns (the next request loads it again). A number for every model, and "
        "NAME=SECONDS for one: `300,coder=3600`. 0: never.",
        ("serve",),
        default="300",
    ),
    Setting(
        "BONSAI_PIN",
        "pin",
        "str",
        "`bonsai serve`: models (comma-separated names) that are loaded at start and never unloaded, by idle "
        "time or to make room.",
        ("serve",),
        default_text="none",
    ),
    Setting(
        "BONSAI_PRELOAD",
        "preload",
        "str",
        "`bonsai serve`: models (comma-separated names, or `all`) loaded at start instead of on their first "
        "request; idle unloading still applies to them.",
        ("serve",),
        default_text="none",
    ),
    # The speculation watch (bonsai_launch/server/watch.py): the running server's own counters.
    Setting(
        "BONSAI_WATCH_SECONDS",
        "watch_seconds",
        "int",
        "How often the process that restarts a speculative server (the keeper of `start --detach`, or a "
        "foreground `start`) reads its /props and /metrics to judge whether speculation still pays on the work "
        "it gets; `bonsai ps` shows the verdict (SPEC WATCH). A sleeping server is left alone (/props only). "
        "It never restarts a server: when speculation is below plain for BONSAI_WATCH_WINDOWS windows under "
        "BONSAI_SPECULATIVE=auto, the decision is marked stale and the next `bonsai start` tunes again. 0: off.",
        _START,
        default=30,
        minimum=0,
        maximum=86_400,
    ),
    Setting(
        "BONSAI_WATCH_WINDOW_TOKENS",
        "watch_window_tokens",
        "int",
        "Drafted tokens in one watch window: the window's acceptance (accepted / drafted, from the server's "
        "/metrics) and decode speed are judged once this many tokens were drafted since the window began.",
        _START,
        default=512,
        minimum=1,
        maximum=10_000_000,
    ),
    Setting(
        "BONSAI_WATCH_WINDOWS",
        "watch_windows",
        "int",
        "Consecutive watch windows that must each be below plain before `bonsai ps` says so and an auto "
        "decision is marked for re-tuning (a sustained change of work, not one odd request).",
        _START,
        default=3,
        minimum=1,
        maximum=1000,
    ),
    Setting(
        "BONSAI_WATCH_MIN_ACCEPT_PERCENT",
        "watch_min_accept_percent",
        "int",
        "A watch window whose drafts were accepted less often than this (percent of drafted tokens) is below "
        "plain: verifying mostly rejected drafts costs more than the few kept tokens save. Under "
        "BONSAI_SPECULATIVE=auto a window is also below plain when its decode speed is under the plain speed "
        "the decision measured.",
        _START,
        default=20,
        minimum=0,
        maximum=100,
    ),
    Setting(
        "BONSAI_TUNE_SAMPLE",
        "tune_sample",
        "int",
        "Keep the prompts of up to this many recent requests, so that `bonsai tune --prompts recent` decides on "
        "the server's own work. Off (0) by default. The process that restarts the server reads each slot's last "
        "prompt from /slots every BONSAI_WATCH_SECONDS (llama-server shows it there, and logs prompt text on "
        "cache misses, only with LLAMA_SERVER_SLOTS_DEBUG=1, which bonsai then sets: anyone who can call the "
        "server's API can read them). The sample is a file per model under BONSAI_HOME/tune/samples, readable "
        "by you alone, the newest N prompts of at most 64 KiB each; nothing leaves the machine. "
        "`bonsai tune --prompts recent` then measures on it, and a re-tune the speculation watch asked for uses it.",
        _START,
        default=0,
        minimum=0,
        maximum=1000,
    ),
    Setting("BONSAI_LLAMA_VERBOSE", "verbose", "bool", "Pass --verbose to llama-server.", _START, default=False),
    Setting(
        "BONSAI_RESTART",
        "restart",
        "bool",
        "Restart a llama-server that dies on its own (a signal, an abort, a non-zero exit) on the same port, "
        "with backoff, for `bonsai start` in the foreground, --detach and fleet replicas; 5 exits within 60 s "
        "stop it (a crash loop). Never after `bonsai stop` or Ctrl+C.",
        ("start", "fleet", "config"),
        default=True,
    ),
    Setting(
        "BONSAI_ALLOW_REMOTE",
        "allow_remote",
        "bool",
        "Allow a non-loopback BONSAI_HOST (an API key is then required).",
        _START,
        default=False,
    ),
    Setting(
        "BONSAI_API_KEY",
        "api_key",
        "secret",
        "API key llama-server requires from clients, on loopback too (several: comma-separated; bonsai's clients send the first); generated and printed once when a remote host is allowed and none is set.",
        _START + ("verify", "chat"),
    ),
    Setting(
        "BONSAI_HOME",
        "home",
        "path",
        "Root of bonsai's caches: sources, builds, the chat page's assets (ui), models, logs.",
        ("build", "pull", "start", "run", "doctor", "models", "config"),
        default_text="~/.cache/bonsai (%LOCALAPPDATA%\\bonsai on Windows)",
    ),
    Setting(
        "BONSAI_MODELS_DIR",
        "models_dir",
        "path",
        "Where models are stored (default BONSAI_HOME/models).",
        _PULL + ("rm",),
        default_text="$BONSAI_HOME/models",
    ),
    Setting(
        "BONSAI_PROFILES_DIR",
        "profiles_dir",
        "path",
        "An extra folder of profile YAML files; its profiles override built-in ones of the same name.",
        _START + ("pull", "models"),
        default_text="none",
    ),
    Setting(
        "BONSAI_BACKEND",
        "backend",
        "choice",
        "Which llama.cpp backend to build and run: auto picks a GPU backend only when a device of that kind is present and falls back to the CPU build when that build fails; a named one (software devices included) is obeyed and its failure stops. `bonsai build --backend` overrides it.",
        ("build", "start", "run", "bench", "doctor", "config"),
        choices=("auto", "cpu", "cuda", "metal", "vulkan", "hip"),
        default_text="auto",
    ),
    Setting(
        "BONSAI_BUILD_UI",
        "build_ui",
        "bool",
        "Build llama.cpp's chat page (tools/ui) with npm, once per pin, and embed it in llama-server (llamacpp/builds/webui.py). Off: no npm runs and the server has no page. Without npm, or when npm fails, the server is built without the page either way.",
        ("build", "start", "run"),
        default=True,
    ),
    Setting(
        "BONSAI_SELF_TEST_FAULT",
        "self_test_fault",
        "choice",
        "A test switch of the build self-test (`bonsai build`, `bonsai doctor --self-test`): make one check see a wrong answer, as a build with that bug would give (hybrid: the second of two concurrent sequences gets a wrong column; gpu: the offloaded distribution moves past the tolerance; speculative: the speculative answer differs). The verdict is recorded and acted on as a real one; rerun `bonsai doctor --self-test` without it to clear it.",
        ("build", "doctor"),
        choices=("hybrid", "gpu", "speculative"),
        default_text="unset (no fault)",
    ),
    Setting(
        "BONSAI_LLAMA_SERVER",
        "llama_server",
        "path",
        "Use this existing llama-server binary (on Windows .exe may be left out) instead of one built by `bonsai build`.",
        ("start", "run", "bench", "doctor", "config"),
        default_text="the build for the detected backend",
    ),
)

BY_ENV: dict[str, Setting] = {s.env: s for s in SETTINGS}
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


def parse_value(setting: Setting, raw: Any, origin: str) -> Any:
    """Turn a raw value (string from env/profile, or a typed flag) into the setting's type.

    `origin` names where it came from (`BONSAI_CTX`, `--ctx`, `profiles/x.yaml: ctx`) so the
    error message points at the right place.
    """
    text = str(raw).strip() if not isinstance(raw, bool) else ("1" if raw else "0")

    def refuse(problem: str) -> BonsaiError:
        return BonsaiError(f"{origin}={raw!r} {problem}; allowed: {setting.allowed()}")

    for value, why in setting.refused:
        if text.lower() == value:
            raise refuse(f"is refused ({why})")

    if setting.kind == "bool":
        if isinstance(raw, bool):
            return raw
        word = text.lower()
        if setting.auto and word == "auto":
            return "auto"
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise refuse("is not a boolean")
    if setting.kind == "int":
        if isinstance(raw, bool):
            raise refuse("is not a whole number")
        try:
            number = int(text, 10) if not isinstance(raw, int) else raw
        except ValueError:
            raise refuse("is not a whole number") from None
        if setting.minimum is not None and number < setting.minimum:
            raise refuse("is too small")
        if setting.maximum is not None and number > setting.maximum:
            raise refuse("is too large")
        return number
    if setting.kind == "choice":
        words = [w.strip().lower() for w in text.split(",")] if setting.combined else [text.lower()]
        known = {c.lower(): c for c in setting.choices}
        unknown = [w for w in words if w not in known]
        if unknown:
            raise refuse("is not a known value" if len(words) == 1 else f"names {unknown[0]!r}, not a known value")
        found = sorted({known[w] for w in words}, key=setting.choices.index)
        if len(found) > 1 and "none" in found:
            raise refuse("combines none with other values")
        return ",".join(found)
    if not text:
        raise refuse("is empty")
    return text


@dataclass(frozen=True)
class Resolved:
    value: Any
    source: Source


@dataclass(frozen=True)
class Settings:
    """The effective value of every setting and where it came from."""

    values: Mapping[str, Resolved] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key].value

    def get(self, key: str) -> Any:
        found = self.values.get(key)
        return found.value if found else None

    def source(self, key: str) -> Source:
        return self.values[key].source

    def is_explicit(self, key: str) -> bool:
        """Set by the user (flag, passthrough or environment), not by a profile or a default."""
        return key in self.values and self.values[key].source in ("flag", "passthrough", "env")


def read_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parse every BONSAI_* variable that is set and non-empty. Unknown BONSAI_* names are
    left alone (other tools may use the prefix)."""
    env = os.environ if env is None else env
    parsed: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = env.get(setting.env)
        if raw is None or raw.strip() == "":
            continue
        parsed[setting.key] = parse_value(setting, raw, setting.env)
    # The reference launcher reads PORT; BONSAI_PORT wins when both are set.
    if "port" not in parsed and (env.get("PORT") or "").strip():
        parsed["port"] = parse_value(BY_KEY["port"], env["PORT"], "PORT")
    return parsed


def env_value(key: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting from the environment, else its default, for commands that need one value
    (`ps`, `verify` and `fleet` asking for the API key): the other BONSAI_* variables are not
    read, so a bad value in one of them does not stop a command that never uses it."""
    env = os.environ if env is None else env
    setting = BY_KEY[key]
    raw = env.get(setting.env)
    if raw is None or raw.strip() == "":
        if key == "port" and (env.get("PORT") or "").strip():
            return parse_value(setting, env["PORT"], "PORT")
        return setting.default
    return parse_value(setting, raw, setting.env)


def parse_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Validate typed CLI flag values (None means not given) with the same rules as env."""
    parsed: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None:
            continue
        setting = BY_KEY[key]
        parsed[key] = parse_value(setting, value, "--" + key.replace("_", "-"))
    return parsed


def resolve(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    profile_values: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge the layers. Detected defaults (context, GPU layers) are filled in by the plan,
    which knows the hardware; here a setting without a fixed default stays None."""
    layers: list[tuple[Source, Mapping[str, Any]]] = [
        ("flag", parse_flags(flags or {})),
        ("env", read_env(env)),
        ("profile", dict(profile_values or {})),
    ]
    values: dict[str, Resolved] = {}
    for setting in SETTINGS:
        for source, layer in layers:
            if setting.key in layer:
                values[setting.key] = Resolved(layer[setting.key], source)
                break
        else:
            values[setting.key] = Resolved(setting.default, "default")
    return Settings(values)
