"""Each replica's measured memory over the last hour: a bounded ring kept in the gateway's memory.

Bounded twice: points older than max_age_s are dropped, and at most max_points are kept whatever the
sampling rate (the dashboard's refreshes add points too), so it never grows with uptime or traffic.
"""

from __future__ import annotations

from collections import deque


class MemoryHistory:
    def __init__(self, max_age_s: float = 3600.0, max_points: int = 720):
        self.max_age_s = max_age_s
        self._points: deque[tuple[float, dict[str, int]]] = deque(maxlen=max_points)

    def add(self, at: float, measured: dict[str, int]) -> None:
        """One sample: replica name -> measured bytes, at unix time `at` (out-of-order samples are dropped)."""
        if self._points and at < self._points[-1][0]:
            return
        self._points.append((at, dict(measured)))
        self._forget_before(at - self.max_age_s)

    def _forget_before(self, cutoff: float) -> None:
        while self._points and self._points[0][0] < cutoff:
            self._points.popleft()

    def series(self, now: float) -> dict:
        """{"t": [unix seconds...], "series": {replica: [bytes or None...]}}: the columns a chart plots."""
        self._forget_before(now - self.max_age_s)
        names = sorted({name for _, measured in self._points for name in measured})
        return {
            "t": [at for at, _ in self._points],
            "series": {name: [measured.get(name) for _, measured in self._points] for name in names},
        }

    def __len__(self) -> int:
        return len(self._points)
