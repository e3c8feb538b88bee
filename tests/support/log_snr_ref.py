"""A numpy reference of DSpark log-SNR conditioning, and a fixture that only the exact maths passes.

The maths (shared/reference/dspark-log-snr.md §1-§3, as our patch 0002 implements it): a draft
block is [anchor, MASK, ...]; the anchor row has t = 1000 (log-SNR max), every mask row t = 0
(log-SNR min). feat(t) = [sin(t*f_i) for i < 64] + [cos(t*f_i) for i < 64], f_i = 10000^(-i/64),
in float32. e = fc2 @ SiLU(fc1 @ feat + b1) + b2 is added to the row's token embedding.

The fixture (`write_conditioning_pair`): a target that always predicts token T, and a DSpark
drafter whose trunk adds nothing (zero attention-output and FFN-down projections), so a row's
draft is argmax(output @ RMSNorm(token_embd[token] + e_row)). One row kind, the `focus`, has a
fixed token embedding as long as its conditioning vector: its draft is decided by that vector
(direction and length). The other row
kind gets a huge embedding pointing at T, so it always drafts T. The output head has one row
per candidate vector (unit length): the vector the fixture's `convention` says the focus row
receives sits in row T; every other candidate (the other conventions, and common mistakes:
no fc2 bias, ReLU or no activation instead of SiLU, divisor 63, the raw log-SNR as the angle,
no x1000 scale) sits in a decoy row. A server that computes the focus row's vector as specified
drafts T only for the fixture built with convention "spec"; for any other convention its draft
lands on a decoy and is rejected. With `near_decoys`, hundreds of extra rows surround the
specified vector at a small angle, so the drafts also pin the server's vector to within about
1-2% of the numpy value, in direction and length (the server's vector is observable only
through its drafts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tiny_gguf

HALF = 64
N_FEAT = 2 * HALF
T_ANCHOR, T_MASK = 1000.0, 0.0  # (lambda - min)/(max - min) * 1000 for lambda = max, min
MIN_LOG_SNR, MAX_LOG_SNR = -9.0, 9.0

# The reference's float32 test vectors: i -> (feat_anchor[i], feat_anchor[64 + i]).
ANCHOR_TEST_VECTORS = {
    0: (0.82687956, 0.56237906),
    1: (-0.89800626, 0.43998268),
    32: (-0.5440203, -0.83907205),
    63: (0.11522167, 0.9933398),
}

CONVENTIONS = ("spec", "sin_cos_swapped", "anchor_mask_swapped")
FOCUSES = ("mask", "anchor")


def features(t: float, *, divisor: float = HALF, cos_first: bool = False) -> np.ndarray:
    """The 128 features in float32, in the order the patch computes them:
    (-ln(1e4) * i) / divisor, exp, t * f, sin/cos. divisor/cos_first exist to build decoys."""
    i = np.arange(HALF, dtype=np.float32)
    freq = np.exp((np.float32(-np.log(np.float32(10000.0))) * i) / np.float32(divisor)).astype(np.float32)
    angle = (np.float32(t) * freq).astype(np.float32)
    sin, cos = np.sin(angle).astype(np.float32), np.cos(angle).astype(np.float32)
    return np.concatenate([cos, sin] if cos_first else [sin, cos]).astype(np.float32)


def features_f64(t: float) -> np.ndarray:
    i = np.arange(HALF, dtype=np.float64)
    angle = t * np.exp(-np.log(10000.0) * i / HALF)
    return np.concatenate([np.sin(angle), np.cos(angle)])


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class Mlp:
    """The log-SNR MLP in numpy layout: fc1 (E, 128), b1 (E,), fc2 (E, E), b2 (E,)."""

    fc1: np.ndarray
    b1: np.ndarray
    fc2: np.ndarray
    b2: np.ndarray

    @classmethod
    def random(cls, embedding: int, seed: int) -> Mlp:
        rng = np.random.default_rng(seed)

        def draw(*shape: int, scale: float) -> np.ndarray:
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        return cls(
            draw(embedding, N_FEAT, scale=0.08),
            draw(embedding, scale=0.5),
            draw(embedding, embedding, scale=0.3),
            draw(embedding, scale=1.0),
        )

    def weights(self) -> dict[str, np.ndarray]:
        return {
            "log_snr_fc1.weight": self.fc1,
            "log_snr_fc1.bias": self.b1,
            "log_snr_fc2.weight": self.fc2,
            "log_snr_fc2.bias": self.b2,
        }

    def __call__(
        self, feat: np.ndarray, act: Callable[[np.ndarray], np.ndarray] = silu, fc2_bias: bool = True
    ) -> np.ndarray:
        h = act(feat.astype(np.float64) @ self.fc1.T.astype(np.float64) + self.b1)
        return h @ self.fc2.T.astype(np.float64) + (self.b2 if fc2_bias else 0.0)


def conditioning(mlp: Mlp) -> tuple[np.ndarray, np.ndarray]:
    """(e_anchor, e_mask) as specified."""
    return mlp(features(T_ANCHOR)), mlp(features(T_MASK))


def row_vector(mlp: Mlp, focus: str, convention: str) -> np.ndarray:
    """The vector a `focus` row receives if the server followed `convention`."""
    t_own, t_other = (T_MASK, T_ANCHOR) if focus == "mask" else (T_ANCHOR, T_MASK)
    if convention == "spec":
        return mlp(features(t_own))
    if convention == "sin_cos_swapped":
        return mlp(features(t_own, cos_first=True))
    if convention == "anchor_mask_swapped":
        return mlp(features(t_other))
    raise ValueError(f"unknown convention {convention!r} (one of {', '.join(CONVENTIONS)})")


def mistakes(mlp: Mlp, focus: str) -> dict[str, np.ndarray]:
    """Plausible wrong implementations of the focus row's vector (decoys)."""
    t = T_MASK if focus == "mask" else T_ANCHOR
    out = {
        "no_fc2_bias": mlp(features(t), fc2_bias=False),
        "relu": mlp(features(t), act=lambda x: np.maximum(x, 0.0)),
        "no_activation": mlp(features(t), act=lambda x: x),
    }
    if focus == "anchor":  # the mask row's features (t = 0) do not depend on these
        out["divisor_63"] = mlp(features(t, divisor=HALF - 1))
        out["raw_log_snr_angle"] = mlp(features(MAX_LOG_SNR))
        out["no_x1000"] = mlp(features(1.0))
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


@dataclass(frozen=True)
class ConditioningPair:
    target: Path
    drafter: Path
    token: int  # what the target always predicts
    rows: dict[str, int]  # candidate name -> output row (token id)


def write_conditioning_pair(
    folder: Path,
    *,
    convention: str = "spec",
    focus: str = "mask",
    token: int = 7,
    vocab: int = 512,
    embedding: int = 64,
    seed: int = 3,
    min_margin: float = 0.02,
    near_decoys: int = 0,
    near_angle: float = 0.004,
) -> ConditioningPair:
    """Write the target and the drafter described in the module docstring into `folder`.

    near_decoys > 0 (convention "spec" only) adds that many decoy rows at `near_angle` radians
    from the specified vector, in random directions: the server's vector then has to lie within
    about that angle of the numpy value, or a near decoy outscores row T and the draft fails.
    """
    if focus not in FOCUSES:
        raise ValueError(f"unknown focus {focus!r} (one of {', '.join(FOCUSES)})")
    mlp = Mlp.random(embedding, seed)
    # the focus row's own token embedding: as long as the vector, so that the direction of the
    # sum (all RMSNorm leaves) also depends on the vector's length
    rng = np.random.default_rng(seed + 2000)
    own = _unit(rng.standard_normal(embedding)) * np.linalg.norm(row_vector(mlp, focus, "spec"))
    believed = own + row_vector(mlp, focus, convention)
    candidates = {f"convention:{c}": own + row_vector(mlp, focus, c) for c in CONVENTIONS if c != convention}
    candidates.update({k: own + v for k, v in mistakes(mlp, focus).items()})

    units = {"believed": _unit(believed), **{k: _unit(v) for k, v in candidates.items()}}
    names = list(units)
    # what a correct server computes must be told apart from every other row by a clear margin
    # in cosine (decoys may resemble each other, or the believed vector: harmless)
    spec = _unit(own + row_vector(mlp, focus, "spec"))
    spec_row = "believed" if convention == "spec" else "convention:spec"
    for name in names:
        cos = float(spec @ units[name])
        if name != spec_row and cos > 1.0 - min_margin:
            raise ValueError(f"seed {seed}: the specified vector and {name} are too alike (cos {cos:.4f})")

    mask = vocab - 1
    rows = {"believed": token}
    out = np.zeros((vocab, embedding), dtype=np.float32)
    out[token] = units["believed"]
    for k, name in enumerate(n for n in names if n != "believed"):
        rows[name] = 100 + k
        out[100 + k] = units[name]
    if near_decoys:
        if convention != "spec":
            raise ValueError("near_decoys surround the specified vector: use them with convention 'spec'")
        first = 100 + len(names)
        if first + near_decoys >= mask:
            raise ValueError(f"{near_decoys} near decoys do not fit a vocabulary of {vocab}")
        rng = np.random.default_rng(seed + 1000)
        for k in range(near_decoys):
            r = rng.standard_normal(embedding)
            r -= (r @ spec) * spec  # orthogonal to the specified direction
            out[first + k] = np.cos(near_angle) * spec + np.sin(near_angle) * _unit(r)

    # the other row kind: a huge embedding along row T's direction, so it always drafts T
    scale = 1000.0 * max(float(np.linalg.norm(v)) for v in (believed, *candidates.values()))
    pinned = (scale * units["believed"]).astype(np.float32)
    embd = np.zeros((vocab, embedding), dtype=np.float32)
    if focus == "mask":
        embd[:] = pinned
        embd[mask] = own
    else:
        embd[:] = own
        embd[mask] = pinned

    folder.mkdir(parents=True, exist_ok=True)
    target = tiny_gguf.write_target(folder / "cond-target.gguf", embedding=embedding, vocab=vocab, constant_token=token)
    drafter = tiny_gguf.write_dspark_drafter(
        folder / f"cond-drafter-{focus}-{convention}.gguf",
        target_embedding=embedding,
        vocab=vocab,
        block_size=4,
        constant_token=token,
        mask_token_id=mask,
        log_snr=tiny_gguf.LogSnr(min_log_snr=MIN_LOG_SNR, max_log_snr=MAX_LOG_SNR, weights=mlp.weights()),
        tensor_overrides={"token_embd.weight": embd, "output.weight": out},
        name=f"tiny-dspark-log-snr-{focus}-{convention}",
    )
    return ConditioningPair(target, drafter, token, rows)


def simulate_drafts(
    drafter: Path,
    block: list[int],
    server_convention: str = "spec",
    error: float = 0.0,
    seed: int = 0,
    scale: float = 1.0,
) -> list[int]:
    """What the fixture's drafter drafts for `block` (anchor first, then masks) if the server
    computed the conditioning by `server_convention`, each vector off by a random relative
    `error` and multiplied by `scale`: argmax(output @ RMSNorm(x)) per row. Valid for write_conditioning_pair's drafters
    only (their trunk adds nothing)."""
    from gguf import GGUFReader

    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in GGUFReader(drafter).tensors}
    mlp = Mlp(*(tensors[n].astype(np.float32) for n in tiny_gguf.LOG_SNR_TENSORS))
    x = tensors["token_embd.weight"][block].copy()
    rng = np.random.default_rng(seed)
    for rows, kind in ((slice(0, 1), "anchor"), (slice(1, None), "mask")):
        e = row_vector(mlp, kind, server_convention)
        x[rows] += scale * e + error * np.linalg.norm(e) * _unit(rng.standard_normal(e.shape))
    x /= np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    return [int(i) for i in np.argmax(x @ tensors["output.weight"].T, axis=1)]
