"""Legacy DSpark drafters, converted once and reused: for a profile, and for `--drafter LEGACY.gguf`.

A profile whose drafter entry says `convert: dspark` (ternary-27b, bonsai-27b) names PrismML's
`*-dspark-bf16.gguf` sidecar. `bonsai pull --speculative` downloads it and converts it against
the profile's own model file into `<profile folder>/<name>-dspark-dflash-Q4_0.gguf`, which
`bonsai start` then runs. A legacy file passed with `--drafter` is converted into
BONSAI_HOME/cache/drafters/ instead. Either way llama-server never sees a legacy file.

A conversion is *current* when its recorded provenance (provenance.Provenance) matches the
source's sha256, the target's vocabulary fingerprint and this converter's version. The
source's sha256 comes from the pull's verification record or from a small memo keyed by path,
size and mtime (written by the conversion itself, which hashes the source on the way), so
checking is instant and a 7 GB file is hashed at most once.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from bonsai_launch.config.profiles import ModelFile, Profile
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.paths import bonsai_home
from bonsai_launch.models import store as model_store
from bonsai_launch.models.drafters import provenance, quantize

CONVERT_KINDS = ("dspark",)


@dataclass(frozen=True)
class DrafterState:
    """What is on disk for a profile's drafter: absent, downloaded, converted (but stale) or current."""

    state: str
    source: Path | None  # the legacy sidecar (None: the profile's drafter needs no conversion)
    converted: Path | None
    reasons: tuple[str, ...] = ()


def needs_conversion(entry: ModelFile | None) -> bool:
    return entry is not None and entry.convert in CONVERT_KINDS


def profile_output(profile: Profile, entry: ModelFile) -> Path:
    return model_store.folder(profile.name) / provenance.default_output_name(Path(entry.name))


def cache_output(source: Path, target: Path) -> Path:
    """Where `--drafter LEGACY.gguf` is converted to: one file per (source path, target vocabulary)."""
    from bonsai_launch.models.gguf import inspect_gguf

    key = hashlib.sha256(f"{source.resolve()}\0{inspect_gguf(target).vocab_fingerprint}".encode()).hexdigest()[:12]
    name = provenance.default_output_name(source).removesuffix(".gguf")
    return bonsai_home() / "cache" / "drafters" / f"{name}-{key}.gguf"


# --- the source's sha256, without re-hashing gigabytes --------------------------------------------


def _memo_file(path: Path) -> Path:
    return (
        bonsai_home() / "cache" / "sha256" / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24] + ".json")
    )


def remember_sha256(path: Path, sha: str) -> None:
    st = path.stat()
    memo = _memo_file(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps({"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha})
    )
    os.replace(tmp, memo)


def known_sha256(path: Path) -> str | None:
    """The sha256 of `path` if a verification record or the memo vouches for it unchanged."""
    try:
        st = path.stat()
        data = json.loads(_memo_file(path).read_text())
        if data["size"] == st.st_size and data["mtime_ns"] == st.st_mtime_ns:
            return str(data["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _profile_sha(profile: Profile, entry: ModelFile) -> str | None:
    s = model_store.state(profile.name, entry.name)
    if s.verified and s.record is not None:
        return s.record.sha256
    return known_sha256(s.path) if s.present else None


# --- states ---------------------------------------------------------------------------------------


def state_of(source: Path | None, converted: Path, target: Path, source_sha: str | None) -> DrafterState:
    """absent: neither file; downloaded: only the source; converted: a conversion that is stale
    (or cannot be checked: the target is missing); current: a conversion that fits."""
    if not converted.is_file():
        present = source is not None and source.is_file()
        return DrafterState("downloaded" if present else "absent", source, None)
    if not target.is_file():
        return DrafterState("converted", source, converted, (f"target {target.name} is not present",))
    source_present = source is not None and source.is_file()
    sha = source_sha if source_present else None  # a removed sidecar: trust the record for the source
    reasons = provenance.stale_reasons(converted, sha, target)
    if source_present and sha is None:
        reasons = reasons + ["the source's sha256 is not known yet"]
    return DrafterState("current" if not reasons else "converted", source, converted, tuple(reasons))


def profile_drafter_state(profile: Profile, entry: ModelFile, target: Path) -> DrafterState:
    source = model_store.folder(profile.name) / entry.name
    return state_of(source, profile_output(profile, entry), target, _profile_sha(profile, entry))


# --- converting -------------------------------------------------------------------------------------


def ensure_converted(
    source: Path, target: Path, output: Path, *, source_sha: str | None = None, reporter=None
) -> tuple[Path, bool]:
    """`output` as the current conversion of `source` for `target`: (path, converted now?).

    Converts (and quantizes to Q4_0) when the output is absent or stale; the source's sha256
    is remembered so the next check needs no hashing.
    """
    from filelock import FileLock

    from bonsai_launch.models.drafters import convert as drafter_convert  # the converter: only when converting

    output.parent.mkdir(parents=True, exist_ok=True)
    # two starts with the same legacy drafter: the second waits, then finds the conversion current
    with FileLock(str(output.with_name(f".{output.name}.lock"))):
        sha = source_sha or known_sha256(source)
        if state_of(source, output, target, sha).state == "current":
            return output, False
        result = drafter_convert.convert_drafter(
            source,
            target,
            output,
            force=True,
            reporter=reporter,
            quantize_finder=lambda: find_quantize_or_build(reporter),
        )
    remember_sha256(source, result.provenance.source_sha256)
    return output, True


def find_quantize_or_build(reporter=None) -> Path:
    """llama-quantize from our build; built now (with llama-server, from the pin) when missing."""
    try:
        return quantize.find_quantize()
    except BonsaiError:
        if os.environ.get("BONSAI_LLAMA_SERVER"):
            raise  # the user chose a binary: do not build another one behind their back
    from bonsai_launch.core.console import console
    from bonsai_launch.llamacpp.builds.builder import BuildRequest, build
    from bonsai_launch.llamacpp.builds.lookup import detected_backend

    if reporter is not None:
        reporter.note(
            "llama-quantize (needed to shrink the converted drafter) is not built yet: running `bonsai build`"
        )
    build(BuildRequest(backend=detected_backend()), console=console(stderr=True))
    return quantize.find_quantize()


def usable_drafter(drafter: Path, target: Path, *, reporter=None) -> Path:
    """What to hand llama-server for `--drafter`: the file itself, or for a legacy `dspark`
    file its conversion in the cache (made now when needed)."""
    if not provenance.is_legacy_drafter(drafter):
        return drafter
    if not target.is_file():
        raise BonsaiError(
            f"model file {target} is not present, so the legacy drafter {drafter.name} cannot be converted for it",
            "pull the model first, or pass --model PATH",
        )
    output = cache_output(drafter, target)
    path, made = ensure_converted(drafter, target, output, reporter=reporter)
    if made and reporter is not None:
        reporter.note(f"converted the legacy drafter {drafter.name} for {target.name}: {path}")
    return path


def refusal_for_legacy(drafter: Path, target: Path) -> BonsaiError:
    """The one line for a legacy drafter where nothing may be converted (a dry run)."""
    out = cache_output(drafter, target) if target.is_file() else Path(provenance.default_output_name(drafter))
    return BonsaiError(
        f"{drafter.name} is a legacy 'dspark' drafter, which llama-server cannot load as it is",
        f"convert it once: bonsai convert-drafter {drafter} --target {target} -o {out} "
        "(`bonsai start` without --dry-run does this for you)",
    )
