"""The communication side of the simulator: one FIFO stream per process group, link sharing between groups.

A collective runs in two phases on its group's stream: its latency part (fixed, not shared), then its
bandwidth-bound part, whose work (nanoseconds at the link's full bandwidth) progresses at rate ``1/k`` while ``k``
collectives of different groups are in their bandwidth phase on the same :class:`~commsched.cost.LinkClass`
(processor sharing). Collectives on different link classes do not slow each other. While ``scale`` > 1 (the
simulation loops set it to the cost model's ``comm_slowdown`` while a kernel runs) bandwidth work progresses
``scale`` times slower still.

The engine is advanced lazily: :meth:`CommEngine.advance_to` simulates up to a time, given the collectives issued
so far. Issues must come in time order and no earlier than the engine's clock.
"""

from __future__ import annotations

import math

INF = 1 << 62
_EPS = 1e-6  # ns of bandwidth work below which a phase counts as done (float progress)


class CommEngine:
    """Per-group FIFO comm streams; times are int nanoseconds. See the module docstring for the model."""

    def __init__(
        self,
        num_groups: int,
        group: list[int],
        lat_ns: list[int],
        bw_ns: list[int],
        link: list[int],
        sync_ns: int,
        start_ns: list[int],
        end_ns: list[int],
    ) -> None:
        self.t = 0
        self.group, self.lat_ns, self.bw_ns, self.link, self.sync_ns = group, lat_ns, bw_ns, link, sync_ns
        self.start_ns, self.end_ns = start_ns, end_ns  # shared with the caller; end_ns[c] == -1 until done
        self.queue: list[list[int]] = [[] for _ in range(num_groups)]  # issued, not started (FIFO, head at qhead)
        self.qhead = [0] * num_groups
        self.ready_at: list[int] = [0] * len(group)  # issue + sync: earliest start of a queued collective
        self.cur = [-1] * num_groups  # running collective per group
        self.lat_end = [0] * num_groups  # end of the running collective's latency phase
        self.in_bw = [False] * num_groups
        self.rem = [0.0] * num_groups  # bandwidth work left (ns at full bandwidth)
        self.sharing = [0] * (max(link, default=0) + 2)  # collectives in bandwidth phase per link class
        self.inflight = 0  # running collectives (either phase): compute is slowed while > 0
        self.pending = 0  # issued and not finished
        self.busy_ns = [0] * num_groups
        self.scale = 1.0  # bandwidth phases progress at 1 / (sharing * scale); change it only at the engine clock

    # ------------------------------------------------------------------ input
    def issue(self, c: int, t: int) -> None:
        """Collective ``c`` is issued at ``t`` (>= the engine clock)."""
        if t > self.t:
            self.advance_to(t)
        g = self.group[c]
        self.ready_at[c] = t + self.sync_ns
        self.queue[g].append(c)
        self.pending += 1
        if self.cur[g] < 0 and self.qhead[g] == len(self.queue[g]) - 1 and self.ready_at[c] <= self.t:
            self._start_next(g, self.t)

    # ------------------------------------------------------------------ clock
    def next_event(self) -> int:
        """Time of the next state change (a phase ends, a queued collective may start); INF if none."""
        if not self.pending:
            return INF
        best = INF
        for g, c in enumerate(self.cur):
            if c >= 0:
                if not self.in_bw[g]:
                    te = self.lat_end[g]
                else:
                    k = self.sharing[self.link[c]] * self.scale
                    te = (
                        self.t + math.ceil(self.rem[g] * k - _EPS) if k != 1 else self.t + math.ceil(self.rem[g] - _EPS)
                    )
            elif self.qhead[g] < len(self.queue[g]):
                te = max(self.t, self.ready_at[self.queue[g][self.qhead[g]]])
            else:
                continue
            if te < best:
                best = te
        return best

    def advance_to(self, t_end: int) -> None:
        """Simulate every comm event up to and including time ``t_end``; leaves the clock at ``t_end``."""
        while self.pending:
            te = self.next_event()
            if te > t_end:
                break
            self._progress(te)
            self._fire(te)
        if t_end > self.t:
            self._progress(t_end)

    def run_until_done(self, c: int) -> int:
        """Advance until collective ``c`` has finished (valid only while no one can issue meanwhile); its end."""
        while self.end_ns[c] < 0:
            te = self.next_event()
            if te >= INF:
                raise RuntimeError(f"collective {c} can never finish: it was not issued")
            self._progress(te)
            self._fire(te)
        return self.end_ns[c]

    # ------------------------------------------------------------------ internals
    def _progress(self, t: int) -> None:
        dt = t - self.t
        if dt > 0 and self.inflight:
            for g, c in enumerate(self.cur):
                if c >= 0 and self.in_bw[g]:
                    self.rem[g] -= dt / (self.sharing[self.link[c]] * self.scale)
        self.t = t

    def _fire(self, t: int) -> None:
        """Apply every transition due at ``t`` (the clock is at ``t``)."""
        changed = True
        while changed:
            changed = False
            for g in range(len(self.cur)):
                c = self.cur[g]
                if c >= 0:
                    if not self.in_bw[g]:
                        if self.lat_end[g] <= t:
                            self._enter_bw(g, c, t)
                            changed = True
                    elif self.rem[g] <= _EPS:
                        self._finish(g, c, t)
                        changed = True
                elif self.qhead[g] < len(self.queue[g]) and self.ready_at[self.queue[g][self.qhead[g]]] <= t:
                    self._start_next(g, t)
                    changed = True

    def _start_next(self, g: int, t: int) -> None:
        c = self.queue[g][self.qhead[g]]
        self.qhead[g] += 1
        self.cur[g] = c
        self.start_ns[c] = t
        self.inflight += 1
        self.in_bw[g] = False
        self.lat_end[g] = t + self.lat_ns[c]
        if self.lat_ns[c] == 0:
            self._enter_bw(g, c, t)

    def _enter_bw(self, g: int, c: int, t: int) -> None:
        if self.bw_ns[c] == 0:
            self._finish(g, c, t)
            return
        self.in_bw[g] = True
        self.rem[g] = float(self.bw_ns[c])
        self.sharing[self.link[c]] += 1

    def _finish(self, g: int, c: int, t: int) -> None:
        if self.in_bw[g]:
            self.sharing[self.link[c]] -= 1
            self.in_bw[g] = False
        self.end_ns[c] = t
        self.busy_ns[g] += t - self.start_ns[c]
        self.cur[g] = -1
        self.inflight -= 1
        self.pending -= 1
        if self.qhead[g] < len(self.queue[g]) and self.ready_at[self.queue[g][self.qhead[g]]] <= t:
            self._start_next(g, t)
