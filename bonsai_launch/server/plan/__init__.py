"""The launch plan: a pure function from what we know to the exact llama-server command.

Inputs are plain values (settings, profile, inspected GGUF headers, hardware, binary
capabilities); the output is a frozen LaunchPlan with the argv, the extra environment and a
reason for every flag. Nothing here touches processes, disk or the network, so `bonsai start
--dry-run` and `bonsai start` share one code path, and tests drive it with tables of cases.

types.py        LaunchPlan, PlanInputs, SpecPlan, Reason, and the ArgvBuilder every part adds through
compose.py      build_plan: host, key, context, slots, speculation, vision, passthrough, in that order
context.py      the context size: speculation's floor, auto from free RAM or GPU memory
speculation.py  a drafter's flags (n-max = its block size) or a draft-free n-gram type
host.py         loopback unless the user opts in, and never beyond it without a key
weights.py      the memory a launch holds: the weights' path and bytes, the KV cache, the RAM fit
"""

from bonsai_launch.server.plan.compose import build_plan
from bonsai_launch.server.plan.host import check_host, is_loopback
from bonsai_launch.server.plan.speculation import ngram_length_flags
from bonsai_launch.server.plan.types import LaunchPlan, PlanInputs, Reason, SpecPlan

__all__ = [
    "LaunchPlan",
    "PlanInputs",
    "Reason",
    "SpecPlan",
    "build_plan",
    "check_host",
    "is_loopback",
    "ngram_length_flags",
]
