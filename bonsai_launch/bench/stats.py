"""Statistics and verdicts: medians with min-max, paired ratios, and the noise rule.

Pure functions over numbers, so the rules that decide "turn it on" are unit-tested without
any server.

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

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

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
