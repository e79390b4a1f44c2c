"""Closed-loop speedup control: hold a mean speedup on a machine whose speed drifts.

The env turns a target speedup into K through a calibration measured earlier
(open loop). On a GPU that holds; on a shared CPU the ratio of an episode's
latency to a stock generation's drifts by several % within minutes, and every
episode after the calibration inherits the error. A governor watches the speedups
actually realised (stock latency / episode latency, timed side by side) and asks
the env for the speedup that, at the machine's current ratio of realised to
requested speedup, gives the target:

    m = sum_i w_i stock_i / sum_i w_i (episode_i * requested_i)     (w: exponential forgetting)
    next request = target / m, clipped to the calibration's range

It changes only which K is run, never how an episode is timed or scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpeedupGovernor:
    """One target speedup's controller. `request()` -> speedup to ask for; `record(...)` after the episode."""

    target: float
    speedup_range: tuple[float, float]
    forgetting: float = 0.9  # weight of the past per new episode: follows drift over ~10 episodes
    _stock: float = field(default=0.0, init=False, repr=False)
    _scaled_episode: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self):
        lo, hi = self.speedup_range
        if not lo <= self.target <= hi:
            raise ValueError(f"target speedup {self.target} is outside the calibrated range [{lo:.2f}, {hi:.2f}]")
        if not 0.0 <= self.forgetting < 1.0:
            raise ValueError(f"forgetting={self.forgetting!r} must be in [0, 1)")

    @property
    def machine_factor(self) -> float:
        """Realised / requested speedup, recent episodes weighted most (1.0 before any episode)."""
        return self._stock / self._scaled_episode if self._scaled_episode > 0 else 1.0

    def request(self) -> float:
        lo, hi = self.speedup_range
        return min(hi, max(lo, self.target / self.machine_factor))

    def record(self, requested: float, stock_s: float, episode_s: float) -> None:
        if not (requested > 0 and stock_s > 0 and episode_s > 0):
            raise ValueError(f"requested={requested!r}, stock_s={stock_s!r}, episode_s={episode_s!r} must be > 0")
        self._stock = self.forgetting * self._stock + stock_s
        self._scaled_episode = self.forgetting * self._scaled_episode + episode_s * requested
