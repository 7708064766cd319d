"""The scheduler's side of an exchange made as one step a worker: where each step runs,
the steps' rendezvous, and what happens when a worker leaves.

- **Placement.** As a graph arrives (before any of its tasks is scheduled), each step is
  bound to one running worker, a different one a slot while there are enough: the worker
  that already holds most of the slot's input bytes, else the next one in address order.
  Steps wait for one another, so two on one worker would share its threads for nothing.
- **Rendezvous.** A step joins with the transports it offers (kind -> its address there);
  the answer comes once every step of the exchange's attempt has joined: the kind all
  offer (:func:`~.transport.chosen`) and every slot's address on it.
- **A worker that leaves** ends the attempt of every exchange it had a step of: the
  steps still running are told (they join the next attempt), the steps that had finished
  are released (each output's getter depends on every step, so dask runs them again), and
  the lost worker's step is bound to another worker. After :data:`RESTARTS` restarts, or
  where a step failed, the exchange is lost: every step still waiting fails with one line.
- **Meetings inside an attempt.** Steps that write into one another's outputs
  (:data:`~.transport.PUT_KINDS`) meet twice a round: once to publish where their outputs
  lie, once to say their writes are done. A meeting of an attempt that ended answers
  ``restart`` (or ``lost``) to its steps; a ``done`` meeting only once every step that may
  still be writing into its peers' outputs has said it is done or left (a step that freed
  its outputs while a peer's kernel still wrote into them would hand that memory to
  whatever it allocates next).
- **The end.** When every step of an exchange is released (its getters took their
  outputs, or the computation was cancelled or failed), the workers that ran its steps
  drop what is left of it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from distributed.diagnostics.plugin import SchedulerPlugin

from spillway.upstream import (has_worker, recommend, restrict_loosely, restrict_strictly, run_args, scheduler_keys,
                               scheduler_task, task_dependencies, task_holders, task_key, task_nbytes, task_state,
                               worker_addresses)
from .names import is_output, is_step
from .state import ABORT, DROP
from .task import JOIN, MEET
from .transport import chosen

logger = logging.getLogger("spillway.step")

PLUGIN_NAME = "spillway-step"
#: restarts of one exchange before it is lost
RESTARTS = 2
#: seconds a step whose transfer failed waits for the scheduler to see a worker leave
#: (then the exchange restarts) before the failure loses the exchange
FAILED_WAIT_S = 30.0
_ENDS = frozenset({"released", "forgotten", "erred"})


class _Meet:
    def __init__(self):
        self.posted: dict[int, object] = {}
        self.done = asyncio.Event()
        #: what every step gets once all have posted (None: the attempt ended first)
        self.answer: dict | None = None


class _Attempt:
    def __init__(self, number: int):
        self.number = number
        self.joined: dict[int, tuple[str, dict]] = {}
        self.done = asyncio.Event()
        self.answer: dict | None = None
        #: ``stage:round`` -> its meeting (:meth:`StepCoordinator.meet`)
        self.meets: dict[str, _Meet] = {}
        #: round -> the slots that had every peer's places: they may be writing
        self.writers: dict[int, set[int]] = {}
        #: what a meeting of this attempt answers once it ended (restart, or lost)
        self.ended: dict | None = None


class _Exchange:
    def __init__(self, name: str, slots: int, attempt: int):
        self.name = name
        self.slots = slots
        self.attempt = _Attempt(attempt)
        #: slot -> the worker its step is bound to
        self.placed: dict[int, str] = {}
        #: workers that joined a step of it (they hold its outputs, and are told when it ends)
        self.workers: set[str] = set()
        self.restarts = 0
        self.lost: str | None = None
        #: getter key -> the slot whose step joins its output
        self.getters: dict = {}
        #: ended attempts whose meetings still wait (number -> attempt)
        self.ended: dict[int, _Attempt] = {}


class StepCoordinator(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.scheduler = None
        self._exchanges: dict[str, _Exchange] = {}
        #: attempts are numbered across exchanges: a worker told an attempt ended never
        #: mistakes a later computation of the same exchange for it
        self._numbers = itertools.count()
        #: the exchange whose steps :meth:`_restart` is releasing (not its end)
        self._restarting: str | None = None
        #: exchanges that ended while a meeting of theirs still waits for writers
        self._ending: dict[str, _Exchange] = {}

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers[JOIN] = self.join
        scheduler.handlers[MEET] = self.meet

    # --- placement

    def update_graph(self, scheduler, *, tasks=(), **kwargs) -> None:
        steps: dict[str, list] = {}
        getters: dict[str, dict] = {}
        for key in tasks:
            if is_step(key):
                steps.setdefault(key[0], []).append(key)
            elif is_output(key):
                args = run_args(scheduler_task(self.scheduler, key))
                if len(args) > 2 and isinstance(args[0], str) and type(args[2]) is int:
                    getters.setdefault(args[0], {})[key] = args[2]
        for name, keys in steps.items():
            exchange = self._exchanges.get(name)
            if exchange is None or exchange.lost:
                exchange = self._exchanges[name] = _Exchange(name, len(keys), next(self._numbers))
            exchange.getters.update(getters.get(name, {}))
            self._place(exchange, [scheduler_task(self.scheduler, k) for k in sorted(keys, key=lambda k: k[1])])

    def _place(self, exchange: _Exchange, steps: list) -> None:
        running = sorted(worker_addresses(self.scheduler, running=True))
        if not running:
            return
        taken = {a for s, a in exchange.placed.items() if a in running}
        for ts in steps:
            slot = task_key(ts)[1]
            if task_state(ts) == "memory" or exchange.placed.get(slot) in running:
                if slot in exchange.placed:
                    restrict_strictly(ts, exchange.placed[slot])
                continue
            held: dict[str, int] = {}
            for dts in task_dependencies(ts):
                for address in task_holders(dts):
                    held[address] = held.get(address, 0) + task_nbytes(dts)
            free = [a for a in running if a not in taken] or running
            address = max(free, key=lambda a: (held.get(a, 0), -free.index(a)))
            exchange.placed[slot] = address
            taken.add(address)
            restrict_strictly(ts, address)
        # each output's getter where its step keeps it (loosely: a worker that left hands
        # it to another, which takes the output from wherever the step ran again)
        for key, slot in exchange.getters.items():
            gts = scheduler_task(self.scheduler, key)
            if gts is not None and slot in exchange.placed and task_state(gts) not in ("memory", "processing"):
                restrict_loosely(gts, exchange.placed[slot])

    # --- the rendezvous

    async def join(self, name=None, slot=0, seen=-1, worker=None, offers=None, failed=None) -> dict:
        exchange = self._exchanges.get(name)
        if exchange is None:
            # its graph came before this plugin: the steps it has, placed as they are
            slots = sum(1 for k in scheduler_keys(self.scheduler) if is_step(k) and k[0] == name)
            exchange = self._exchanges[name] = _Exchange(name, max(slots, 1), next(self._numbers))
        if failed:
            # a transfer failed: a worker leaving restarts the attempt; else it is lost
            waited = 0.0
            while exchange.lost is None and exchange.attempt.number <= seen and waited < FAILED_WAIT_S:
                await asyncio.sleep(0.1)
                waited += 0.1
            if exchange.lost is None and exchange.attempt.number <= seen:
                self._lose(exchange, f"step {slot} on {worker}: {failed}")
        if exchange.lost:
            return {"lost": exchange.lost}
        attempt = exchange.attempt
        attempt.joined[slot] = (worker, offers or {})
        exchange.workers.add(worker)
        if len(attempt.joined) >= exchange.slots and attempt.answer is None:
            kind = chosen([o for _, o in attempt.joined.values()])
            attempt.answer = {"attempt": attempt.number, "kind": kind,
                              "peers": {s: o[kind] for s, (_, o) in attempt.joined.items()},
                              "workers": {s: w for s, (w, _) in attempt.joined.items()}}
            attempt.done.set()
        await attempt.done.wait()
        if exchange.lost:
            return {"lost": exchange.lost}
        return attempt.answer

    async def meet(self, name=None, slot=0, attempt=0, stage="", round=0, payload=None) -> dict:
        """Steps of one attempt meeting at ``stage`` of round ``round``: each posts its
        ``payload`` and gets every slot's once all have posted (``{"payloads": {slot:
        payload}}``), or the attempt's end (``restart``, ``lost``)."""
        exchange, found = None, None
        for known in (self._exchanges.get(name), self._ending.get(name)):
            if known is not None:
                found = known.attempt if known.attempt.number == attempt else known.ended.get(attempt)
                if found is not None:
                    exchange = known
                    break
        if found is None:
            # an attempt that ended with no step left writing into another's outputs
            return {"lost": f"exchange {str(name)[-12:]} ended"} if name not in self._exchanges else {"restart": True}
        meeting = found.meets.setdefault(f"{stage}:{round}", _Meet())
        meeting.posted[int(slot)] = payload
        if found.ended is not None:
            self._release(exchange, found)
        elif len(meeting.posted) >= exchange.slots and not meeting.done.is_set():
            if stage == "places":
                found.writers[round] = set(meeting.posted)
            failed = sorted((s, p["failed"]) for s, p in meeting.posted.items() if isinstance(p, dict) and p.get("failed"))
            if failed:
                # every step has ended its kernel: lost, each told so (none is writing)
                s, why = failed[0]
                self._lose(exchange, f"step {s} on {found.joined.get(s, ('?',))[0]}: {why}")
            else:
                meeting.answer = {"payloads": dict(meeting.posted)}
                meeting.done.set()
        await meeting.done.wait()
        if meeting.answer is not None:
            return meeting.answer
        return found.ended or {"restart": True}

    def _release(self, exchange: _Exchange, attempt: _Attempt) -> None:
        """The meetings of ``attempt`` (ended) that may answer now: a ``places`` meeting
        at once, a ``done`` meeting once none of the round's writers is still writing."""
        running = set(worker_addresses(self.scheduler))
        gone = {s for s, (w, _) in attempt.joined.items() if w not in running}
        waiting = False
        for key, meeting in attempt.meets.items():
            if meeting.done.is_set():
                continue
            stage, _, round_ = key.partition(":")
            if stage == "done" and attempt.writers.get(int(round_), set()) - set(meeting.posted) - gone:
                waiting = True
                continue
            meeting.done.set()
        if waiting:
            exchange.ended[attempt.number] = attempt
        else:
            exchange.ended.pop(attempt.number, None)
            if not exchange.ended and self._ending.get(exchange.name) is exchange:
                del self._ending[exchange.name]

    def _end_attempt(self, exchange: _Exchange, attempt: _Attempt, answer: dict) -> None:
        attempt.ended = answer
        self._release(exchange, attempt)

    # --- a worker that leaves, a step that fails, the end

    def remove_worker(self, scheduler=None, worker=None, **kwargs) -> None:
        for exchange in list(self._ending.values()):
            for attempt in list(exchange.ended.values()):
                self._release(exchange, attempt)  # a writer that left writes no more
        for exchange in list(self._exchanges.values()):
            for attempt in list(exchange.ended.values()):
                self._release(exchange, attempt)
            if exchange.lost or (worker not in exchange.workers and worker not in exchange.placed.values()):
                continue
            if exchange.restarts >= RESTARTS:
                self._lose(exchange, f"worker {worker} left, after {exchange.restarts} restart(s) of the exchange")
            else:
                self._restart(exchange, f"worker {worker} left")

    def _restart(self, exchange: _Exchange, why: str) -> None:
        ended = exchange.attempt
        exchange.restarts += 1
        exchange.attempt = _Attempt(next(self._numbers))
        ended.answer = {"attempt": ended.number, "restart": True}
        ended.done.set()
        self._end_attempt(exchange, ended, {"restart": True})
        self._tell(exchange, ABORT, attempt=ended.number, why=why)
        logger.warning("exchange %s restarts (%d of %d): %s", exchange.name[-12:], exchange.restarts, RESTARTS, why)
        running = set(worker_addresses(self.scheduler, running=True))
        exchange.workers &= running
        steps = [ts for s in range(exchange.slots) if (ts := scheduler_task(self.scheduler, (exchange.name, s)))]
        for s in [s for s, a in exchange.placed.items() if a not in running]:
            del exchange.placed[s]
        self._place(exchange, steps)
        recommendations = {task_key(ts): "released" for ts in steps if task_state(ts) in ("memory", "no-worker")}
        self._restarting = exchange.name
        try:
            recommend(self.scheduler, recommendations, f"spillway-step-restart-{exchange.name}")
        finally:
            self._restarting = None

    def _lose(self, exchange: _Exchange, why: str) -> None:
        if exchange.lost:
            return
        exchange.lost = (f"exchange {exchange.name[-12:]} cannot finish: {why} (a worker lost mid-exchange takes "
                         f"pieces only the whole exchange could make again)")
        exchange.attempt.done.set()
        self._end_attempt(exchange, exchange.attempt, {"lost": exchange.lost})
        self._tell(exchange, ABORT, attempt=exchange.attempt.number, why=exchange.lost)

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish not in _ENDS or not is_step(key):
            return
        exchange = self._exchanges.get(key[0])
        if exchange is None or self._restarting == key[0]:
            return
        if finish == "erred" and exchange.lost is None:
            self._lose(exchange, f"step {key[1]} failed")
        if all((ts := scheduler_task(self.scheduler, (key[0], s))) is None or task_state(ts) in _ENDS
               for s in range(exchange.slots)):
            self._end(exchange)

    def _end(self, exchange: _Exchange) -> None:
        self._exchanges.pop(exchange.name, None)
        exchange.attempt.done.set()
        if exchange.lost is None:
            exchange.lost = f"exchange {exchange.name[-12:]} ended"
        for attempt in (exchange.attempt, *exchange.ended.values()):
            self._end_attempt(exchange, attempt, attempt.ended or {"lost": exchange.lost})
        if exchange.ended:
            # a computation released mid-round (cancelled): its steps' kernels may still
            # write into one another's outputs, which their meetings keep until they end
            self._ending[exchange.name] = exchange
        self._tell(exchange, DROP)

    def _tell(self, exchange: _Exchange, op: str, **message) -> None:
        # only workers that joined: they have the handlers (a worker's stream stops at an
        # op it has no handler for)
        for address in exchange.workers:
            if has_worker(self.scheduler, address):
                self.scheduler.worker_send(address, {"op": op, "name": exchange.name, **message})
