"""The weights file llama-server gets for a Bonsai 2 file: refused, repacked, or as it is.

A folded file needs a build that undoes the fold; PrismML's PQ2_0/PTQ1_0 take the path
models/weight_path.py chooses: as they are (a fork build; PTQ1_0 on a CPU build with its
kernels) or as their lossless Q2_0 repack (models/codec_repack.py, made once and cached); the old
group-128 "Q2_0" never runs (models/bonsai2_file.py). Checked before anything is spawned.
"""

from __future__ import annotations

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.core.hardware import Hardware
from bonsai_launch.llamacpp.capabilities import Capabilities
from bonsai_launch.llamacpp.flavours import FORK, BuildKind
from bonsai_launch.models import bonsai2_file, codec_repack, weight_path
from bonsai_launch.models.gguf import GGUFInfo, inspect_gguf
from bonsai_launch.models.weight_path import NATIVE, WeightPath


def serveable(
    target: GGUFInfo, kind: BuildKind, path: WeightPath, *, foreign: bool, repack: bool
) -> tuple[GGUFInfo, str | None]:
    """(the file to hand llama-server, a note for the plan's warnings).

    kind: the build's; path: weight_path.choose's decision for this file and build; foreign: a
    binary bonsai did not build (nothing known of it: it is taken to fold and take fork types
    only when it is taken to be a fork build); repack: make the Q2_0 repack now if it is missing
    (a dry run only says it would)."""
    _refuse_hazard(target, kind, foreign=foreign)
    found = bonsai2_file.fork_types(target)
    if path.path == NATIVE:
        return target, None
    done = codec_repack.current(target.path)
    if done is None and repack:
        from bonsai_launch.models.progress import RichReporter

        with RichReporter() as reporter:
            reporter.note(f"{target.path.name}: repacking {'/'.join(found)} into mainline Q2_0, once (lossless)")
            bar = reporter.bar("repacking", target.data_bytes)
            done = codec_repack.repack(target.path, progress=bar.update)
            bar.close()
    what = f"{target.path.name} ({'/'.join(found)}) runs as its lossless Q2_0 repack"
    if done is None:
        return target, f"{what}, made when the server starts ({codec_repack.output_path(target.path)})"
    return inspect_gguf(done), f"{what} {done}"


def needs_text(info: GGUFInfo) -> str | None:
    """Which builds run a Bonsai 2 file and why, for `inspect`, `models` and `doctor` (None: any)."""
    parts = []
    if info.fold_version:
        parts.append(f"the Hadamard fold (v{info.fold_version}): bonsai's build (patch 0010) or the PrismML fork")
    found = bonsai2_file.fork_types(info)
    if found:
        parts.append(
            f"{'/'.join(found)}: bonsai's build serves it repacked as Q2_0 (lossless; PTQ1_0 as it is on a CPU build "
            "with its kernels), the fork natively"
        )
    return "; ".join(parts) or None


def path_on(info: GGUFInfo, kind: BuildKind, caps: Capabilities | None, hardware: Hardware | None) -> WeightPath:
    """The weight path of `info` on a build of `kind` with these capabilities (None: not built
    yet, taken to be today's builds: no PTQ1_0 kernels), on the backend the plan will use."""
    from bonsai_launch.server.plan.weights import backend_of

    return weight_path.choose(
        info.tensor_types,
        info.type_bytes,
        backend_of(caps, hardware),
        fork_build=kind.flavour == FORK,
        ptq1_0_cpu=caps is not None and caps.ptq1_0_cpu,
    )


def default_path(info: GGUFInfo) -> WeightPath:
    """The weight path on the build `start` would run now, for `inspect`."""
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.core.hardware import detect
    from bonsai_launch.llamacpp.binaries import probe
    from bonsai_launch.llamacpp.choice import choose_server

    settings = resolve({})
    choice = choose_server(settings, settings.get("layout") or "mainline")
    caps = probe(choice.path) if choice.path is not None else None
    return path_on(info, choice.kind, caps, None if caps is not None else detect())


def check_for_default_build(info: GGUFInfo) -> None:
    """What `start` would refuse, judged for the build it would run now (the installed mainline
    build, or the one `bonsai build` makes): raises BonsaiError with the one line."""
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.llamacpp.choice import choose_server, kind_of_binary

    settings = resolve({})
    choice = choose_server(settings, settings.get("layout") or "mainline")
    _refuse_hazard(info, choice.kind, foreign=choice.path is not None and kind_of_binary(choice.path) is None)


def _refuse_hazard(info: GGUFInfo, kind: BuildKind, *, foreign: bool) -> None:
    """The one judgement of what a build can take: a fork build folds and reads its own types;
    ours folds from patch 0010 on (folds None: the build not made yet, which will) and repacks;
    a binary bonsai did not build is taken to do neither."""
    fork = kind.flavour == FORK
    problem = bonsai2_file.hazard(
        info, can_fold=fork or (not foreign and kind.folds is not False), repacks=fork or not foreign
    )
    if problem is not None:
        raise BonsaiError(*problem)
