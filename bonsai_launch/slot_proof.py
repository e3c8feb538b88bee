"""Proving that speculation drafts on several slots at once, not only on the first.

llama-server runs one speculative context for all slots. A single probe request only ever
lands on one slot, so with `-np N` the start-up proof also sends short requests to several
slots at the same time, each pinned to its own slot (`id_slot`): the same probe as the
single-request proof (speculation_probe.draft_probe, with its echo request when the first
request drafted nothing), and reads every answer's `timings.draft_n`. Speculation counts as live on the slots whose request drafted; the server
passes when more than one slot drafted (all of them, in practice).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bonsai_launch.errors import ActionFailed
from bonsai_launch.plan import SpecPlan
from bonsai_launch.speculation_probe import PROOF_TOKENS, draft_probe

MAX_PROBED_SLOTS = 8  # enough to show batched drafting; more would only lengthen start-up


@dataclass(frozen=True)
class SlotResult:
    slot: int
    drafted: int
    accepted: int
    error: str | None = None


@dataclass(frozen=True)
class SlotsProof:
    spec_type: str
    slots: int  # slots the server has
    results: tuple[SlotResult, ...]  # one concurrent request per probed slot

    @property
    def drafting(self) -> tuple[int, ...]:
        return tuple(r.slot for r in self.results if r.drafted > 0)

    @property
    def live(self) -> bool:
        return len(self.drafting) >= min(2, len(self.results))

    @property
    def rate(self) -> float | None:
        drafted = sum(r.drafted for r in self.results)
        return sum(r.accepted for r in self.results) / drafted if drafted else None

    def summary(self) -> str:
        probed, drafting = len(self.results), len(self.drafting)
        on = f"{drafting} slots" if drafting == self.slots else f"{drafting} of {self.slots} slots"
        if self.live:
            rate = f", acceptance {self.rate * 100:.1f}%" if self.rate is not None else ""
            return (
                f"speculative decoding: live on {on} ({self.spec_type}; {probed} concurrent requests, "
                f"{drafting} drafted{rate})"
            )
        errors = [f"slot {r.slot}: {r.error}" for r in self.results if r.error]
        return (
            f"speculative decoding: NOT live on several slots ({self.spec_type}): {drafting} of {probed} "
            "concurrent requests drafted" + (f" ({'; '.join(errors)})" if errors else "")
        )

    def to_json(self) -> dict:
        return {
            "live": self.live,
            "type": self.spec_type,
            "slots": self.slots,
            "probed": len(self.results),
            "drafting_slots": list(self.drafting),
            "acceptance": self.rate,
            "per_slot": [
                {"slot": r.slot, "drafted": r.drafted, "accepted": r.accepted, "error": r.error} for r in self.results
            ],
        }


def prove_slots(
    base_url: str, spec: SpecPlan, slots: int, tokens: int = PROOF_TOKENS, api_key: str | None = None
) -> SlotsProof:
    """Run the single-request probe (speculation_probe.draft_probe, echo request included) on
    each of the first slots at the same time, each pinned to its slot."""
    probed = min(slots, MAX_PROBED_SLOTS)

    def one(slot: int) -> SlotResult:
        try:
            found = draft_probe(base_url, api_key, tokens, slot=slot)
        except ActionFailed as exc:
            return SlotResult(slot, 0, 0, exc.message)
        return SlotResult(int(found.first.get("id_slot", slot)), found.drafted, found.accepted)

    with ThreadPoolExecutor(max_workers=probed) as pool:
        results = tuple(pool.map(one, range(probed)))
    return SlotsProof(spec.spec_type, slots, results)
