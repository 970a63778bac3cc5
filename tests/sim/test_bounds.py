"""Lower-bound pieces: Jackson's preemptive rule against a brute-force unit-step schedule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from commsched.sim.bounds import preemptive_jackson_ns


def brute_force(release, work, delivery):
    """Unit-step preemptive schedule: at every step run the released job with the longest delivery time."""
    n, rem, t, best, done = len(work), list(work), 0, 0, 0
    while done < n:
        ready = [j for j in range(n) if release[j] <= t and rem[j] > 0]
        if not ready:
            t = min(release[j] for j in range(n) if rem[j] > 0)
            continue
        j = max(ready, key=lambda j: (delivery[j], -j))
        rem[j] -= 1
        t += 1
        if rem[j] == 0:
            done += 1
            best = max(best, t + delivery[j])
    return best


jobs = st.integers(1, 8).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 12), min_size=n, max_size=n),
        st.lists(st.integers(1, 6), min_size=n, max_size=n),
        st.lists(st.integers(0, 12), min_size=n, max_size=n),
    )
)


@given(jobs)
def test_jackson_matches_brute_force(job):
    release, work, delivery = job
    assert preemptive_jackson_ns(release, work, delivery) == brute_force(release, work, delivery)


def test_jackson_charges_head_and_tail():
    # one job released at 5 with 3 units of work and 4 after it: nothing can finish before 12
    assert preemptive_jackson_ns([5], [3], [4]) == 12
    # a long tail job preempts a short-tail one as soon as it is released
    assert preemptive_jackson_ns([0, 1], [4, 1], [0, 10]) == 12
