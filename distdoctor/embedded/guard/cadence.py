"""How often a rank asks the store for news, and how long a look waits for answers: both from the world's size."""

# The store is the job's one shared resource: the guard's load on it is bounded for the whole job,
# not per rank. A stall is detected locally (the flight recorder, the main thread); the store is
# polled only to learn that another rank asked for a look or published a verdict, one counter key
# per poll:
#   - a rank whose collectives move (the healthy case) polls every max(2 s, N / 64 s): the
#     job's healthy load stays at most 64 requests per second whatever its size (0.016
#     request/s/rank at 4,096 ranks, 0.06 at 1,024); the slow-rank accounting's windows travel at
#     the same cadence or slower (embedded.guard.pace.exchange), so that both together stay under
#     0.1 request/s per rank from 1,024 ranks up;
#   - a rank that answered a look polls every max(0.25 s, N / 8,192 s) until it read the verdict
#     (seconds: the answer deadline), so that a verdict that ends the job is read and said at once;
#   - a rank that has not moved for quiet_after_s (min(hang_timeout / 2, 10 s)) may be the late rank of a
#     stall, or stalled itself, and polls every max(1 s, N / 4,096 s): at most one request per second
#     per rank, at most 4,096 per second for the job;
# and the answer deadline of a look grows with the world and the store's measured round trip, and
# goes on while answers still arrive (a loaded store answers late, not never).

from __future__ import annotations

from dataclasses import dataclass

HEALTHY_JOB_RATE = 64.0    # news polls per second for the whole job while its collectives move
QUIET_JOB_RATE = 4096.0    # ... while they do not
AWAITING_JOB_RATE = 8192.0 # ... while the ranks wait for a look's verdict (a few seconds)
BUSY_FLOOR_S, QUIET_FLOOR_S, AWAITING_FLOOR_S = 2.0, 1.0, 0.25
MAX_ANSWER_S = 30.0        # a look never waits longer for its answers (the verdict says who was not heard from)
REQUESTS_PER_ANSWER = 3    # an answer costs the store about this many requests (state, roster, news)
MIN_RTT_S = 0.0005         # a round trip is never counted shorter than this
FINAL_WAIT_S = 2.0         # a rank that ends waits this long for its store client to open, to leave its final state


def busy_interval_s(world: int) -> float:
    """Seconds between news polls of a rank whose collectives move."""
    return max(BUSY_FLOOR_S, world / HEALTHY_JOB_RATE)


def quiet_interval_s(world: int) -> float:
    """Seconds between news polls of a rank that has not moved for quiet_after_s."""
    return max(QUIET_FLOOR_S, world / QUIET_JOB_RATE)


def awaiting_interval_s(world: int) -> float:
    """Seconds between news polls of a rank that answered a look and waits for its verdict (seconds at
    most: the look's answer deadline): the verdict may end the job, and every rank should say why."""
    return max(AWAITING_FLOOR_S, world / AWAITING_JOB_RATE)


def ack_wait_s(world: int) -> float:
    """How long the rank that ends the job waits for the others to read its verdict (it may host the store)."""
    return min(10.0, 4 * awaiting_interval_s(world) + 2.0)


def quiet_after_s(hang_timeout: float) -> float:
    """A rank that has not moved for this long polls at the quiet interval (it may be a stall's late rank)."""
    return min(hang_timeout / 2.0, 10.0)


@dataclass(frozen=True)
class AnswerWait:
    """How long a look waits for answers: ``first_s`` at least, on while answers keep arriving (no
    gap longer than ``gap_s``), ``last_s`` at most."""

    first_s: float
    gap_s: float
    last_s: float

    def done(self, waited_s: float, since_answer_s: float) -> bool:
        if waited_s >= self.last_s:
            return True
        return waited_s >= self.first_s and since_answer_s >= self.gap_s


def answer_wait(world: int, answer_s: float, rtt_s: float | None) -> AnswerWait:
    """The answer deadline of a look over ``world`` ranks: the configured answer_s, plus the quiet
    interval (a rank outside the collective learns of the look at its next poll), plus the time
    the store takes to take every rank's answer one after another at the measured round trip."""
    rtt = max(rtt_s or 0.0, MIN_RTT_S)
    first = answer_s + quiet_interval_s(world) + world * REQUESTS_PER_ANSWER * rtt
    last = max(answer_s, min(MAX_ANSWER_S, 2.0 * first))
    first = min(first, last)
    return AnswerWait(first_s=first, gap_s=max(0.5, quiet_interval_s(world) / 2.0), last_s=last)
