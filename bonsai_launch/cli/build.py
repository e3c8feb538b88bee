"""`bonsai build`: compile llama-server from the pinned llama.cpp for this machine.

Examples:
    bonsai build                                   # auto backend, pinned source; prints the binary path
    bonsai build --json                            # the manifest: version, flags, capabilities
    bonsai build --backend cuda --cuda-archs 90    # CUDA for H100/H200 without a visible GPU
    pip install 'bonsai-launch[cuda]'              # NVIDIA's toolkit wheels, used when no complete toolkit is installed
    bonsai build --source prismml                  # a named alternative from vendor/llama.cpp/pin.toml
    bonsai build --source git+https://github.com/ggml-org/llama.cpp.git@b6000
    bonsai build --source ~/src/llama.cpp --jobs 4 # a local checkout, as it is
"""

from __future__ import annotations

from typing import Annotated

import typer

from bonsai_launch.cli._options import JsonOpt

BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help="auto, cpu, cuda, metal, vulkan or hip (default: BONSAI_BACKEND, else auto). auto builds a GPU "
        "backend only for a device of its kind and falls back to the CPU when that build fails; a named "
        "backend is obeyed.",
    ),
]
SourceOpt = Annotated[
    str | None,
    typer.Option("--source", help="pin (default), a name from vendor/llama.cpp/pin.toml, git+URL@REF, or a folder."),
]
CudaArchsOpt = Annotated[
    str | None, typer.Option("--cuda-archs", help="CUDA architectures, e.g. 90 or 86,89 (default: the visible GPUs').")
]
GpuTargetsOpt = Annotated[
    str | None, typer.Option("--gpu-targets", help="HIP targets, e.g. gfx1100 (default: the visible GPUs').")
]
JobsOpt = Annotated[
    int | None, typer.Option("--jobs", "-j", help="Parallel compile jobs (default: cores, capped by RAM).")
]
PortableOpt = Annotated[bool, typer.Option("--portable", help="Do not tune for this CPU (GGML_NATIVE=OFF).")]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Configure, compile and install even when up to date; re-fetch a git source.")
]


def command(
    backend: BackendOpt = None,
    source: SourceOpt = None,
    cuda_archs: CudaArchsOpt = None,
    gpu_targets: GpuTargetsOpt = None,
    jobs: JobsOpt = None,
    portable: PortableOpt = False,
    force: ForceOpt = False,
    json_output: JsonOpt = False,
) -> None:
    """Build llama-server, llama-speculative-simple, llama-bench and llama-quantize; print the server's path."""
    from bonsai_launch.cli._output import console, emit_json
    from bonsai_launch.llamacpp.builds import BuildRequest, build
    from bonsai_launch.llamacpp.builds.fallback import requested_backend

    err = console(stderr=True)
    requested, explicit = requested_backend(backend)
    request = BuildRequest(
        backend=requested,
        fall_back_to_cpu=not explicit,
        source=source,
        cuda_archs=cuda_archs,
        gpu_targets=gpu_targets,
        jobs=jobs,
        portable=portable,
        force=force,
    )
    from bonsai_launch.config.settings import env_value
    from bonsai_launch.server import selftest

    result = build(request, console=err)
    result, verdict, ran = selftest.after_build(result, request, console=err, fault=env_value("self_test_fault"))
    if json_output:
        emit_json({**result.manifest, "up_to_date": result.up_to_date, "self_test": verdict})
        return
    m = result.manifest
    caps = m.get("capabilities", {})
    if result.up_to_date:
        err.print(f"up to date: {m['backend']} build {m['key']} ({m.get('version') or 'version unknown'})")
    else:
        err.print(
            f"built in {m['build_seconds']:.0f} s: {m.get('version') or 'version unknown'}; "
            f"speculative types: {', '.join(caps.get('spec_types', [])) or 'none found'}"
        )
    ui = m.get("ui") or {}
    if ui.get("page"):
        err.print(f"[dim]chat page embedded (assets {ui.get('dist')})[/]")
    else:
        from bonsai_launch.llamacpp.builds.webui import HOW_TO_GET

        why = ui.get("reason") or "this build was made before bonsai built the page"
        err.print(f"no chat page: {why}; to get it: {HOW_TO_GET}", markup=False, highlight=False)
    err.print(selftest.summary(verdict, ran))
    print(result.server)
