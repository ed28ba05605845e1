"""Where a start goes: seconds per phase, and a log line as each phase begins (logger ``tflgpu.startup``, INFO),
so a slow start can be followed as it happens (``tflgpu run`` shows them after the first second)."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("tflgpu.startup")


class StartupClock:
    """Phases in the order they ran, each with its seconds (a phase entered twice adds up)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._phase: str | None = None
        self._t = time.perf_counter()

    def phase(self, name: str, detail: str = "") -> None:
        """End the current phase and start ``name`` (``detail``: what it does, for the log line)."""
        self.stop()
        self._phase, self._t = name, time.perf_counter()
        log.info("%s%s", name, f": {detail}" if detail else "")

    def stop(self) -> None:
        if self._phase is not None:
            self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + time.perf_counter() - self._t
            self._phase = None



def format_phases(seconds: dict[str, float]) -> str:
    """``read 0.01 s, cpu kernels 0.01 s, ...``: phases as the log and ``tflgpu run`` show them."""
    return ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
