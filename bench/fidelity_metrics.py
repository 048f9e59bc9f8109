"""How far an engine's greedy tokens stray from a reference's, and whether each divergence was a near-tie.

Pure functions over token-id lists and the reference's per-step top-2 logit margins (top-1 minus
top-2 logit; a small margin means two tokens were nearly equally likely, so a rounding difference
may flip the choice without anything being wrong).
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean, median

# A divergence where the reference's top-2 margin is below this (in logits) is a near-tie flip.
NEAR_TIE_LOGITS = 0.5
PREFIX_LENGTHS = (8, 24)


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where tokens and reference differ (a shorter one ends there); None if equal."""
    for position, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return position
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def margin_at(margins: Sequence[float], position: int | None) -> float | None:
    """The reference's margin at position; None when equal or when the reference had ended there."""
    return margins[position] if position is not None and position < len(margins) else None


def compare_sequences(
    outputs: Sequence[Sequence[int]],
    references: Sequence[Sequence[int]],
    margins: Sequence[Sequence[float]],
    n_tokens: int,
    near_tie: float = NEAR_TIE_LOGITS,
) -> dict:
    """Agreement of an engine's greedy outputs with the reference's, prompt by prompt.

    A prompt's first differing position counts as n_tokens when the sequences are equal, so the mean
    and median cover every prompt. Divergences are split by the reference's margin there."""
    if not (len(outputs) == len(references) == len(margins)):
        raise ValueError("outputs, references and margins must cover the same prompts")
    if not outputs:
        raise ValueError("no prompts to compare")
    firsts = [first_difference(out, ref) for out, ref in zip(outputs, references)]
    positions = [n_tokens if first is None else first for first in firsts]
    div_margins = [margin_at(m, first) for m, first in zip(margins, firsts) if first is not None]
    known = [m for m in div_margins if m is not None]
    n = len(outputs)
    return {
        "n_prompts": n,
        "exact_match": sum(first is None for first in firsts) / n,
        "first_diff_mean": mean(positions),
        "first_diff_median": median(positions),
        **{
            f"agree_first_{k}": sum(list(o[:k]) == list(r[:k]) for o, r in zip(outputs, references)) / n
            for k in PREFIX_LENGTHS
        },
        "divergences": len(div_margins),
        "near_tie_divergences": sum(m < near_tie for m in known),
        "large_margin_divergences": sum(m >= near_tie for m in known),
        "divergence_margin_median": median(known) if known else None,
        "divergence_margin_max": max(known) if known else None,
        "first_diff": firsts,
        "divergence_margins": div_margins,
    }


def teacher_forced(
    argmaxes: Sequence[Sequence[int]],
    references: Sequence[Sequence[int]],
    margins: Sequence[Sequence[float]],
    near_tie: float = NEAR_TIE_LOGITS,
) -> dict:
    """With the reference's tokens fed in, how often the engine's argmax at each position differs from
    the reference's token, and how many of those differences were at near-ties."""
    positions = mismatched = 0
    mismatch_margins = []
    for argmax, reference, margin in zip(argmaxes, references, margins, strict=True):
        if len(argmax) != len(reference):
            raise ValueError("one argmax per reference token")
        positions += len(reference)
        for position, (a, b) in enumerate(zip(argmax, reference)):
            if a != b:
                mismatched += 1
                mismatch_margins.append(margin[position])
    return {
        "positions": positions,
        "mismatches": mismatched,
        "mismatch_rate": mismatched / positions if positions else 0.0,
        "near_tie_mismatches": sum(m < near_tie for m in mismatch_margins),
        "large_margin_mismatches": sum(m >= near_tie for m in mismatch_margins),
        "mismatch_margin_max": max(mismatch_margins) if mismatch_margins else None,
    }
