"""The recurrence depths every evaluation script measures, from the checkpoint's mean recurrence r̄."""

from __future__ import annotations


def depth_grid(mean_recurrence: int) -> list[int]:
    """Every power of two below r̄ (at least 1, 2, 4, 8), then r̄, 2r̄, 4r̄: sorted, no repeats."""
    below = {1, 2, 4, 8} | {
        2**k for k in range(mean_recurrence.bit_length()) if 2**k < mean_recurrence
    }
    return sorted(below | {mean_recurrence, 2 * mean_recurrence, 4 * mean_recurrence})
