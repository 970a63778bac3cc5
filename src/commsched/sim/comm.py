"""The communication side of the simulator: one FIFO stream per process group, link sharing between groups.

A collective runs in two phases on its group's stream: its latency part (fixed, not shared), then its
bandwidth-bound part, whose work (nanoseconds at the link's full bandwidth) progresses at the rate the stream model
gives (:meth:`commsched.sim.model.StreamModel.comm_divisor`: shared by the collectives of different groups in their
bandwidth phase on the same :class:`~commsched.cost.LinkClass`, slower while a kernel runs; the simulation loops say
when one does with :meth:`CommEngine.set_kernel_running`). Collectives on different link classes do not slow each
other.

The engine is advanced lazily: :meth:`CommEngine.advance_to` simulates up to a time, given the collectives issued
so far. Issues must come in time order and no earlier than the engine's clock.
"""

from __future__ import annotations

import math

from commsched.sim.model import EPS_NS, INF_NS, StreamModel


class CommEngine:
    """Per-group FIFO comm streams; times are int nanoseconds. See the module docstring for the model."""

    def __init__(
        self,
        num_groups: int,
        group: list[int],
        lat_ns: list[int],
        bw_ns: list[int],
        link: list[int],
        model: StreamModel,
        start_ns: list[int],
        end_ns: list[int],
        sms: list[bool] | None = None,
    ) -> None:
        self.t = 0
        self.group, self.lat_ns, self.bw_ns, self.link, self.model = group, lat_ns, bw_ns, link, model
        self.start_ns, self.end_ns = start_ns, end_ns  # shared with the caller; end_ns[c] == -1 until done
        self.queue: list[list[int]] = [[] for _ in range(num_groups)]  # issued, not started (FIFO, head at qhead)
        self.qhead = [0] * num_groups
        self.ready_at: list[int] = [0] * len(group)  # issue + sync: earliest start of a queued collective
        self.cur = [-1] * num_groups  # running collective per group
        self.lat_end = [0] * num_groups  # end of the running collective's latency phase
        self.in_bw = [False] * num_groups
        self.rem = [0.0] * num_groups  # bandwidth work left (ns at full bandwidth)
        self.sharing = [0] * (max(link, default=0) + 2)  # collectives in bandwidth phase per link class
        self.kernel_running = False
        # per link class: wall ns per ns of bandwidth work (the model's rate), while no kernel runs and while one does
        self._divisors = ([1.0] * len(self.sharing), [1.0] * len(self.sharing))
        self.divisor = self._divisors[False]
        self.inflight = 0  # running collectives (either phase)
        # per node: its transfer takes SMs (sim.model.takes_sms); compute is slowed while sm_inflight > 0
        self.sms = [True] * len(group) if sms is None else sms
        self.sm_inflight = 0
        self.pending = 0  # issued and not finished
        self.busy_ns = [0] * num_groups

    # ------------------------------------------------------------------ input
    def issue(self, c: int, t: int) -> None:
        """Collective ``c`` is issued at ``t`` (>= the engine clock)."""
        if t > self.t:
            self.advance_to(t)
        g = self.group[c]
        self.ready_at[c] = self.model.comm_start_ns(t, 0)  # the FIFO part of the rule is the queue itself
        self.queue[g].append(c)
        self.pending += 1
        if self.cur[g] < 0 and self.qhead[g] == len(self.queue[g]) - 1 and self.ready_at[c] <= self.t:
            self._start_next(g, self.t)

    def set_kernel_running(self, running: bool) -> None:
        """Whether a kernel runs from the engine's clock on (it changes the bandwidth phases' rate)."""
        self.kernel_running = running
        self.divisor = self._divisors[running]

    # ------------------------------------------------------------------ clock
    def next_event(self) -> int:
        """Time of the next state change (a phase ends, a queued collective may start); INF if none."""
        if not self.pending:
            return INF_NS
        best = INF_NS
        for g, c in enumerate(self.cur):
            if c >= 0:
                if not self.in_bw[g]:
                    te = self.lat_end[g]
                else:
                    te = self.t + math.ceil(self.rem[g] * self.divisor[self.link[c]] - EPS_NS)
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
            if te >= INF_NS:
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
                    self.rem[g] -= dt / self.divisor[self.link[c]]
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
                    elif self.rem[g] <= EPS_NS:
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
        self.sm_inflight += self.sms[c]
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
        self._share(self.link[c], +1)

    def _finish(self, g: int, c: int, t: int) -> None:
        if self.in_bw[g]:
            self._share(self.link[c], -1)
            self.in_bw[g] = False
        self.end_ns[c] = t
        self.busy_ns[g] += t - self.start_ns[c]
        self.cur[g] = -1
        self.inflight -= 1
        self.sm_inflight -= self.sms[c]
        self.pending -= 1
        if self.qhead[g] < len(self.queue[g]) and self.ready_at[self.queue[g][self.qhead[g]]] <= t:
            self._start_next(g, t)

    def _share(self, link: int, delta: int) -> None:
        k = self.sharing[link] + delta
        self.sharing[link] = k
        self._divisors[False][link] = self.model.comm_divisor(k, False)
        self._divisors[True][link] = self.model.comm_divisor(k, True)
