"""Statistics and verdicts: medians with min-max, paired ratios, and the noise rule.

Pure functions over numbers (and over lists of request results: aggregate, group_by,
percentile), so the rules that decide "turn it on" are unit-tested without any server.

The noise rule (also written into every report):
  A configuration is compared with the baseline run by run: repeat r of the candidate with
  repeat r of the baseline (they ran next to each other in time, in alternating order), which
  gives one paired ratio per repeat. The noise band is the larger of 5% and the relative
  spread, (max - min) / median, of either side's own repeats. The verdict is
    - "faster" when every paired ratio is above 1 and the median ratio is at least 1 + band;
    - "slower" when every paired ratio is below 1 and the median ratio is at most 1 - band;
    - "noise" otherwise (the difference is within what repeating the same run produces);
    - "inconclusive" with fewer than 3 repeats: nothing is claimed.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bonsai_launch.bench.measure import RequestResult

MIN_REPEATS = 3
MIN_BAND = 0.05

NOISE_RULE = (
    "paired ratio per repeat (candidate / baseline, same repeat); noise band = max(5%, (max-min)/median of "
    "either side's repeats); 'faster' needs every ratio > 1 and median >= 1 + band, 'slower' every ratio < 1 "
    "and median <= 1 - band; otherwise 'noise'; fewer than 3 repeats: 'inconclusive'"
)


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements."""

    median: float
    min: float
    max: float
    n: int

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)

    @property
    def relative_range(self) -> float:
        return (self.max - self.min) / self.median if self.median else 0.0


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median, min and max of the values that exist; None when there are none."""
    clean = [float(v) for v in values if v is not None]
    if not clean:
        return None
    return Spread(statistics.median(clean), min(clean), max(clean), len(clean))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def paired_ratios(candidate: dict[int, float | None], baseline: dict[int, float | None]) -> list[float]:
    """candidate[r] / baseline[r] for every repeat r measured on both sides."""
    out = []
    for r in sorted(set(candidate) & set(baseline)):
        value = ratio(candidate[r], baseline[r])
        if value is not None:
            out.append(value)
    return out


@dataclass(frozen=True)
class Verdict:
    kind: str  # faster | slower | noise | inconclusive
    ratio: Spread | None  # of the paired ratios
    band: float  # the noise band used (fraction, 0.05 = 5%)
    reason: str

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "ratio": self.ratio.to_json() if self.ratio else None,
            "band": round(self.band, 4),
            "reason": self.reason,
        }


def noise_band(*sides: Spread | None) -> float:
    return max([MIN_BAND] + [s.relative_range for s in sides if s is not None])


def verdict(
    ratios: Sequence[float],
    baseline: Spread | None = None,
    candidate: Spread | None = None,
    min_repeats: int = MIN_REPEATS,
) -> Verdict:
    """Apply the noise rule (module docstring) to the paired ratios of one comparison."""
    summary = spread(ratios)
    band = noise_band(baseline, candidate)
    if summary is None:
        return Verdict("inconclusive", None, band, "no paired measurements")
    if summary.n < min_repeats:
        return Verdict(
            "inconclusive", summary, band, f"only {summary.n} paired repeat(s); at least {min_repeats} needed"
        )
    if summary.min > 1 and summary.median >= 1 + band:
        return Verdict(
            "faster",
            summary,
            band,
            f"every ratio above 1 and median {summary.median:.2f}x beyond the {band:.0%} noise band",
        )
    if summary.max < 1 and summary.median <= 1 - band:
        return Verdict(
            "slower",
            summary,
            band,
            f"every ratio below 1 and median {summary.median:.2f}x beyond the {band:.0%} noise band",
        )
    if summary.min <= 1 <= summary.max:
        why = "ratios fall on both sides of 1"
    else:
        why = f"median {summary.median:.2f}x within the {band:.0%} noise band"
    return Verdict("noise", summary, band, why)


def first_difference(a: str, b: str) -> int | None:
    """Index of the first character where two texts differ (the shorter one's length when
    one is a prefix of the other); None when they are equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # texts of different lengths: up to the shorter
        if x != y:
            return i
    return min(len(a), len(b))


def piece_index(pieces: Sequence[str], char_index: int) -> int:
    """Which streamed piece (about one token each) holds character `char_index`."""
    seen = 0
    for i, piece in enumerate(pieces):
        seen += len(piece)
        if char_index < seen:
            return i
    return max(0, len(pieces) - 1) if pieces else 0


def fmt_ratio(s: Spread | None) -> str:
    if s is None:
        return "-"
    if s.n == 1:
        return f"{s.median:.2f}x"
    return f"{s.median:.2f}x ({s.min:.2f}-{s.max:.2f})"


def fmt_spread(s: Spread | None, digits: int = 1, unit: str = "") -> str:
    if s is None:
        return "-"
    if s.n == 1 or s.min == s.max:
        return f"{s.median:.{digits}f}{unit}"
    return f"{s.median:.{digits}f}{unit} ({s.min:.{digits}f}-{s.max:.{digits}f})"


def _sum(values: Iterable[float | int | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(sum(vals)) if vals else None


def _ok(requests: Iterable[RequestResult]) -> list[RequestResult]:
    return [r for r in requests if not r.error]


def aggregate(requests: list[RequestResult]) -> dict[str, Any]:
    """One repeat of one (configuration, category, temperature): token-weighted rates."""
    ok = _ok(requests)
    out: dict[str, Any] = {"requests": len(requests), "errors": len(requests) - len(ok)}
    tokens = _sum(r.completion_tokens if r.completion_tokens is not None else len(r.pieces) for r in ok) or 0
    out["tokens"] = int(tokens)
    timed = [r for r in ok if r.predicted_n is not None and r.predicted_ms]
    server = (
        sum(r.predicted_n or 0 for r in timed) / (sum(r.predicted_ms or 0.0 for r in timed) / 1000.0)
        if timed and len(timed) == len(ok)
        else None
    )
    decoded = [(r.completion_tokens or len(r.pieces)) - 1 for r in ok if r.client_decode_tps]
    decode_time = [
        ((r.completion_tokens or len(r.pieces)) - 1) / r.client_decode_tps for r in ok if r.client_decode_tps
    ]
    client = sum(decoded) / sum(decode_time) if decode_time and sum(decode_time) > 0 else None
    prefill = [r for r in ok if r.prompt_n and r.prompt_ms]
    out["server_decode_tps"] = server
    out["client_decode_tps"] = client
    out["decode_tps"] = server if server is not None else client
    out["prefill_tps"] = (
        (sum(r.prompt_n or 0 for r in prefill) / (sum(r.prompt_ms or 0.0 for r in prefill) / 1000.0))
        if prefill
        else None
    )
    walls = _sum(r.wall_s for r in ok)
    out["e2e_tps"] = tokens / walls if walls else None
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    out["ttft_s"] = statistics.median(ttfts) if ttfts else None
    drafted = _sum(r.drafted for r in ok)
    accepted = _sum(r.accepted for r in ok)
    steps = _sum(r.verify_steps for r in ok)
    out["drafted"] = int(drafted) if drafted is not None else None
    out["accepted"] = int(accepted) if accepted is not None else None
    out["verify_steps"] = int(steps) if steps is not None else None
    out["acceptance_rate"] = accepted / drafted if drafted and accepted is not None else None
    out["mean_acceptance_length"] = 1 + accepted / steps if steps and accepted is not None else None
    return out


def spread_json(values: Iterable[float | None]) -> dict | None:
    s = spread(values)
    return s.to_json() if s else None


def group_by(requests: Iterable[RequestResult], *keys: str) -> dict[tuple, list[RequestResult]]:
    groups: dict[tuple, list[RequestResult]] = defaultdict(list)
    for r in requests:
        groups[tuple(getattr(r, k) for k in keys)].append(r)
    return groups


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (p95 of 20 values is the 19th smallest); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
