"""The launch plan: a pure function from what we know to the exact llama-server command.

Inputs are plain values (settings, profile, inspected GGUF headers, hardware, binary
capabilities, the tuning decision, notes gathered on the way); the output is a frozen LaunchPlan:
a ServerPlan (the process: binary, address, key, /metrics) and a ModelPlan (one model's flags),
with the extra environment and a reason for every flag. Nothing here touches processes, disk or the network, so `bonsai start
--dry-run` and `bonsai start` share one code path, and tests drive it with tables of cases.

types.py        LaunchPlan (ServerPlan + ModelPlan), PlanInputs, SpecPlan, Reason, and the ArgvBuilder
compose.py      build_plan and plan_model: layers, context, slots, speculation, vision, passthrough
server.py       plan_server: the process half (host, port, key, idle sleep, /metrics)
context.py      the context size: speculation's floor, auto from free RAM or GPU memory
speculation.py  a drafter's flags (n-max = its block size) or a draft-free n-gram type
host.py         loopback unless the user opts in, and never beyond it without a key
weights.py      the memory a launch holds: the weights' path and bytes, the KV cache, the RAM fit;
                plan_context: one model's -c from them, fitted to its slots
router.py       `bonsai serve`: a router's plan, its models' preset file, idle unload, pins, preload
"""

from bonsai_launch.server.plan.compose import build_plan, plan_model
from bonsai_launch.server.plan.host import check_host, is_loopback
from bonsai_launch.server.plan.server import plan_server
from bonsai_launch.server.plan.speculation import ngram_length_flags
from bonsai_launch.server.plan.types import LaunchPlan, ModelPlan, PlanInputs, Reason, ServerPlan, SpecPlan

__all__ = [
    "LaunchPlan",
    "ModelPlan",
    "PlanInputs",
    "Reason",
    "ServerPlan",
    "SpecPlan",
    "build_plan",
    "check_host",
    "is_loopback",
    "ngram_length_flags",
    "plan_model",
    "plan_server",
]
