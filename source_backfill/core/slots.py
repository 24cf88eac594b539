"""A source's history width as slots its jobs' copies take in turn (pure: the caller passes the clock).

The width governor (``core.governor``, stepped in ``runtime/width.py``) answers how much history the
source's copies may run beside its live stream: ``tasks`` Spark tasks at once, and below one task a
``duty``, the share of the time that one task may copy. :class:`HistorySlots` holds the jobs to it:

* **Tasks.** A copy takes its tasks when it starts and gives them back when it ends; the copies running
  together never hold more than ``tasks`` (a job whose share is more than what is free waits). Fifteen
  backfilling jobs on a width of two copy two at a time, not fifteen on two cores beside the live stream.
* **Turns.** The jobs that asked wait in the order they first asked; a free slot goes to the first of
  them still asking (a job asks again at each of its epochs; one that has nothing to copy any more
  withdraws, and one that has not asked for ``stale_s`` has left the queue). So a job whose copy just
  ended does not take its slot again before the others had theirs.
* **Namespaces.** With jobs of several namespaces (tenants) waiting, the turn goes first to the
  namespace that has held the fewest slot-seconds for its share (``shares``, 1 each unless given), then
  to its first job in the queue: two namespaces of equal shares each hold about half the width over
  time, whatever their numbers of jobs. A namespace that comes back after none of its jobs asked starts
  level with the least served one, not with the credit of its idle time.
* **Duty.** Below one task a copy that took ``s`` seconds closes the slots for ``s * (1 / duty - 1)``
  seconds after it: the copies then run ``duty`` of the time on average. The width governor goes there
  when even one task at a time keeps the live latency over its target (a small machine, many jobs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class HistorySlots:
    """The slots of one source's history copies: who holds them, who waits, when they open again."""

    tasks: int = 1
    duty: float = 1.0
    #: Seconds after which a job that has not asked again leaves the queue.
    stale_s: float = 5.0
    #: Tasks each running copy holds, by job.
    held: dict[str, int] = field(default_factory=dict)
    #: Jobs waiting for a slot, in the order they first asked, with when they last asked.
    waiting: dict[str, float] = field(default_factory=dict)
    #: No copy starts before this (monotonic seconds): the rest of a duty cycle.
    closed_until: float = 0.0
    #: A job's namespace (None: all jobs in one, turns in queue order).
    namespace_of: Callable[[str], str] | None = None
    #: Each namespace's share of the width (1 when not named).
    shares: dict[str, float] = field(default_factory=dict)
    #: Slot-seconds each namespace's copies held (tasks x seconds), for the turns.
    used: dict[str, float] = field(default_factory=dict)

    def resize(self, tasks: int, duty: float) -> None:
        """The governor's answer: ``tasks`` at once (at least one), below one task ``duty`` of the time."""
        self.tasks = max(1, tasks)
        self.duty = min(1.0, max(duty, 1e-3))

    def free(self) -> int:
        """Tasks no running copy holds."""
        return max(0, self.tasks - sum(self.held.values()))

    def take(self, job: str, tasks: int, now: float) -> bool:
        """``job`` asks to start a copy of ``tasks`` tasks at ``now``: granted, or queued (asked again later).

        A job holding slots already (a copy running) is never granted more: its next copy waits for it.
        """
        tasks = max(1, min(tasks, self.tasks))
        if job in self.held:
            return False
        if job not in self.waiting:
            self._level(self._namespace(job))
        self.waiting[job] = now  # a job asking again keeps its place
        self._forget_stale(now)
        first = self._first_in_turn()
        if first != job or now < self.closed_until or self.free() < tasks:
            return False
        del self.waiting[job]
        self.held[job] = tasks
        return True

    def give_back(self, job: str, seconds: float, now: float) -> str | None:
        """``job``'s copy ended at ``now`` after ``seconds``: its slots are free; the next job in turn.

        Returns the job first in the queue when a copy may start now (it may be asked to try at once),
        else None.
        """
        tasks = self.held.pop(job, None)
        if tasks is None:
            return None
        namespace = self._namespace(job)
        self.used[namespace] = self.used.get(namespace, 0.0) + tasks * max(0.0, seconds)
        if self.duty < 1.0:
            self.closed_until = max(self.closed_until, now + max(0.0, seconds) * (1.0 / self.duty - 1.0))
        return self._next_in_turn(now)

    def withdraw(self, job: str, now: float) -> str | None:
        """``job`` no longer asks (nothing to copy now: its rate limit, its tail, a backoff): it leaves.

        So it does not hold the others back. Returns the job first in turn now, when a copy may start.
        """
        if self.waiting.pop(job, None) is None:
            return None
        return self._next_in_turn(now)

    def leave(self, job: str) -> None:
        """``job`` no longer copies (dropped, failed): out of the queue; slots it held are given back."""
        self.waiting.pop(job, None)
        self.held.pop(job, None)

    def _next_in_turn(self, now: float) -> str | None:
        """The job first in the queue when a copy may start at ``now`` (slots free, not closed), else None."""
        self._forget_stale(now)
        if now < self.closed_until or not self.waiting or not self.free():
            return None
        return self._first_in_turn()

    def _namespace(self, job: str) -> str:
        return self.namespace_of(job) if self.namespace_of is not None else ""

    def _served(self, namespace: str) -> float:
        """Slot-seconds held per share: the lower, the sooner its turn."""
        return self.used.get(namespace, 0.0) / max(self.shares.get(namespace, 1.0), 1e-9)

    def _first_in_turn(self) -> str:
        """The first waiting job of the least served namespace (the queue's first with one namespace)."""
        if self.namespace_of is None:
            return next(iter(self.waiting))
        first_of: dict[str, str] = {}
        for job in self.waiting:  # in queue order: each namespace's first waiting job
            first_of.setdefault(self._namespace(job), job)
        order = list(first_of)  # ties go to the namespace whose first job waits longest
        return first_of[min(order, key=lambda ns: (self._served(ns), order.index(ns)))]

    def _level(self, namespace: str) -> None:
        """A namespace none of whose jobs waits or copies comes back level with the least served other."""
        if self.namespace_of is None:
            return
        active = {self._namespace(j) for j in (*self.waiting, *self.held)}
        if namespace in active:
            return
        others = [self._served(ns) for ns in active]
        if others:
            share = self.shares.get(namespace, 1.0)
            self.used[namespace] = max(self.used.get(namespace, 0.0), min(others) * share)

    def _forget_stale(self, now: float) -> None:
        for name, asked in list(self.waiting.items()):
            if now - asked > self.stale_s:
                del self.waiting[name]
