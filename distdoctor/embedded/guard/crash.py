"""An exception that ends a rank: captured before the rank exits, published, and named on every rank."""

# sys.excepthook is chained (the user's hook, or Python's, still prints the traceback and the exit
# code stays the user's). Before the rank exits it leaves its final snapshot in the store (status
# raised, the exception's type, message and innermost user frame), so the peers whose collective
# then fails ("Connection closed by peer": a consequence) or who wait can name the cause. A rank
# whose own error is a consequence waits up to answer_s for its peers' final snapshots and asks
# diagnosis.diagnose which rank failed first. A launcher that saw a rank fail sends SIGTERM to
# the others (torchrun within about 0.1 s): while this bounded diagnosis runs the SIGTERM is held,
# then delivered, so the rank still ends the way the launcher asked.
# A guarded call that fails leaves its final snapshot before the error reaches the user's code,
# which may catch it and go on (a retry, a fallback). That final is provisional: when the rank
# issues another collective it is withdrawn (the rank is alive, its live answers count again),
# when the exception ends the rank it stands, and when the rank leaves normally its clean
# final replaces it (process.Guard.shutdown asks `withdrawn()`).

from __future__ import annotations

import signal
import sys
import threading
import time
from types import TracebackType
from typing import Any

from distdoctor.diagnosis.snapshot import RAISED, RUNNING
from distdoctor.embedded.guard import report as api
from distdoctor.embedded.guard import snapshot as snapshots
from distdoctor.embedded.guard.peers import absent_snapshot


class _HeldSigterm:
    """Hold SIGTERM for a bounded diagnosis in the main thread; deliver it afterwards."""

    def __enter__(self) -> "_HeldSigterm":
        self.caught, self.previous = False, None
        if threading.current_thread() is threading.main_thread():
            try:
                self.previous = signal.signal(signal.SIGTERM, self._hold)
            except (ValueError, OSError):
                self.previous = None
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        self.caught = True

    def __exit__(self, *exc: Any) -> None:
        if self.previous is None:
            return
        signal.signal(signal.SIGTERM, self.previous)
        if self.caught:
            signal.raise_signal(signal.SIGTERM)


MAX_THREAD_ERRORS = 8
# A stall that closed this recently is the one a peer's failure ends (torch's timeout closes it first).
RECENT_S = 10.0


class CrashHook:
    """The guard's sys.excepthook and threading.excepthook, in front of whatever hooks were there."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.previous: Any = None
        self.previous_thread: Any = None
        self.thread_errors: list[Any] = []
        self.provisional = False      # the final left by a failed guarded call, until the rank goes on or ends

    def install(self) -> None:
        self._install_thread_hook()
        if getattr(sys.excepthook, "__distdoctor_guard__", False):
            return
        self.previous = sys.excepthook

        def hook(exc_type: type, exc: BaseException, tb: TracebackType | None) -> None:
            held = _HeldSigterm()
            with held:
                try:
                    self.on_exception(exc, tb)
                except Exception:  # the user's traceback must be printed whatever happens here
                    pass
                (self.previous or sys.__excepthook__)(exc_type, exc, tb)

        hook.__distdoctor_guard__ = True  # type: ignore[attr-defined]
        self.hook = hook
        sys.excepthook = hook

    def _install_thread_hook(self) -> None:
        """An exception that ends a thread other than the main one (a data loader's prefetch thread):
        kept for this rank's snapshot, shown with the stall it causes; the previous hook still prints it."""
        if getattr(threading.excepthook, "__distdoctor_guard__", False):
            return
        self.previous_thread = threading.excepthook

        def thread_hook(args: Any) -> None:
            try:
                if args.exc_type is not SystemExit and args.exc_value is not None:
                    name = getattr(args.thread, "name", "") or "a thread"
                    self.thread_errors = (self.thread_errors + [
                        snapshots.raised_error(args.exc_value, args.exc_traceback, thread=name)])[-MAX_THREAD_ERRORS:]
            except Exception:  # the thread's traceback must be printed whatever happens here
                pass
            (self.previous_thread or threading.__excepthook__)(args)

        thread_hook.__distdoctor_guard__ = True  # type: ignore[attr-defined]
        self.thread_hook = thread_hook
        threading.excepthook = thread_hook

    def uninstall(self) -> None:
        if getattr(self, "hook", None) is not None and sys.excepthook is self.hook:
            sys.excepthook = self.previous or sys.__excepthook__
        if getattr(self, "thread_hook", None) is not None and threading.excepthook is self.thread_hook:
            threading.excepthook = self.previous_thread or threading.__excepthook__

    def on_exception(self, exc: BaseException, tb: TracebackType | None) -> None:
        guard = self.guard
        self.provisional = False  # the exception ends the rank: the final its failed call left stands
        if isinstance(exc, api.GuardError) and guard.final_left and not guard.concluded:
            guard.concluded = True  # a failed call the guard explained: its report, as this rank's last word
            guard.write_json(exc.report, "exception")
            self._stall_ends_with_the_run()
            return
        if guard.concluded or guard.final_left or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return
        if isinstance(exc, api.GuardError):  # already reported on every rank of its group
            guard.leave_final(guard.state(RAISED, keep=False, error=snapshots.raised_error(exc, tb)))
            return
        findings = self.verdict(exc, tb, list(range(guard.world)))
        if not findings:
            return
        guard.concluded = True
        report = guard.report(findings, ranks=list(range(guard.world)))
        error = snapshots.raised_error(exc, tb)
        if error.consequence:
            heading = (f"distdoctor guard (rank {guard.rank}): this rank's {error.type} is a consequence; "
                       "what happened first:")
        else:
            heading = f"distdoctor guard (rank {guard.rank}): this rank raised {error.type}; the job ends:"
        sys.stderr.write(api.render_text(report, heading) + "\n")
        sys.stderr.flush()
        guard.write_json(report, "exception")
        self._stall_ends_with_the_run()

    def _stall_ends_with_the_run(self) -> None:
        """The stall this rank watches is still open as its exception ends it: in stalls.json it is an
        error, with how long it lasted."""
        watch = self.guard.watch
        episode = getattr(watch, "own", None)
        if episode is None or episode.seconds is not None:
            return
        episode.seconds, episode.ended_run = episode.stall.seconds(watch.clock()), True
        try:
            watch.ledger.keep(episode)
        except Exception as exc:  # the store is gone: this rank's report is what is left
            self.guard.fault("store channel", exc)
            return
        self.guard.stalls_changed()

    def verdict(self, exc: BaseException, tb: TracebackType | None, ranks: list[int], call: Any = None) -> list[Any]:
        """Leave this rank's final snapshot; the job's findings from it and the peers' finals.

        ``call``: the guarded call that failed (the stack above it, not the traceback, holds the
        user's line then)."""
        from distdoctor.embedded.guard.verdict import decide  # loaded only when a rank fails

        guard = self.guard
        error = snapshots.raised_error(exc, tb)
        if call is None:
            own = guard.state(RAISED, error=error, stack=snapshots.traceback_frames(tb),
                              in_collective=guard.failed_wait(tb) if error.consequence else None)
        else:
            own = guard.state(RAISED, error=error, in_collective=snapshots.call_text(call), failed_call=call)
        guard.leave_final(own)
        if call is not None:
            self._watch_for_more()
        states: dict[int, Any] = {guard.rank: own}
        side = guard.watch.side if guard.watch is not None else None
        others = [r for r in ranks if r != guard.rank]
        if side is not None and others:
            # A peer's own error is published before its process ends; a consequence waits for it.
            wait_s = guard.settings.answer_s if error.consequence else 0.0
            until = time.monotonic() + wait_s
            try:
                while True:
                    states.update(side.read_many("final", [r for r in others if r not in states]))
                    if all(r in states for r in others) or time.monotonic() >= until:
                        break
                    time.sleep(0.05)
                hellos = side.read_many("hello", [r for r in others if r not in states]) if error.consequence else {}
            except Exception as exc:  # the store is gone: this rank's own view
                guard.fault("store channel", exc)
                hellos = {}
            if error.consequence:
                seen = self._last_seen()
                for rank in others:
                    if rank not in states:
                        absent = absent_snapshot(rank, hellos.get(rank), wait_s, asked=False)
                        states[rank] = {"snapshot": seen[rank] if absent.status == RUNNING and rank in seen
                                        else absent.to_dict()}
        return decide(states, [r for r in ranks if r in states], None, world_known=False)

    def _last_seen(self) -> dict[int, dict]:
        """The peers as the latest look at the stall this rank watches saw them: when torch's own
        timeout ends that wait, a late rank that is still alive is named at the line it was seen at."""
        watch = self.guard.watch
        episode = getattr(watch, "own", None) or getattr(watch, "latest", None)
        ended = getattr(episode, "seconds", None)
        if episode is None or (ended is not None and time.time() - (episode.started_at + ended) > RECENT_S):
            return self._answered_seen()
        findings = getattr(episode, "findings", None) or ()
        snaps = (findings[0].data or {}).get("snapshots") or () if findings else ()
        return {s["rank"]: {**s, "notes": [*(s.get("notes") or ()), f"as the guard's look at stall {episode.id} saw it"]}
                for s in snaps if isinstance(s, dict) and isinstance(s.get("rank"), int)}

    def _answered_seen(self) -> dict[int, dict]:
        """The peers as they answered the latest look this rank answered, when another rank asked it recently:
        the stall may be another rank's episode (the late rank's own watchdog, seeing gloo's late mark of its
        last collective, asked first), and the late rank is then named at the line it answered from, not
        "where in your code is not known" (a CI-equivalent run of 2026-11-30)."""
        guard = self.guard
        board = getattr(guard.watch, "board", None)
        side = getattr(guard.watch, "side", None)
        look = getattr(board, "answered", 0)
        if board is None or side is None or not look:
            return {}
        try:
            request = board.request(look)
            if request is None or time.time() - float(request.get("t") or 0.0) > RECENT_S:
                return {}
            others = [r for r in range(guard.world) if r != guard.rank]
            answers = side.read_many(f"look/{look}/state", others, listed=others)
        except Exception:  # the store is gone: the peers' own finals, or nothing, are what is left
            return {}
        out: dict[int, dict] = {}
        for rank, value in answers.items():
            snap = value.get("snapshot") if isinstance(value, dict) else None
            if isinstance(snap, dict) and snap.get("rank") == rank:
                out[rank] = {**snap, "notes": [*(snap.get("notes") or ()), f"as it answered the guard's look {look}"]}
        return out

    # -- a failed call's final, while the user's code may still catch the error ---------------------
    def _issued(self) -> tuple[int, int]:
        """(guarded calls begun, collectives the recorder counts issued): what grows when the rank goes on."""
        guard = self.guard
        flight = guard.flight
        enqueued = sum(e for e, _ in flight.status().values()) if flight is not None and flight.usable else 0
        return guard.recorder.calls, enqueued

    def _watch_for_more(self) -> None:
        """Withdraw the provisional final as soon as the rank issues another call (a thread of its own,
        started only after a failed call; it ends with the provisional state)."""
        self.provisional = True
        try:
            before = self._issued()
        except Exception:  # nothing to compare with: the final stays until shutdown replaces it
            return
        interval = getattr(self.guard.settings, "poll_s", 0.25)

        def watch() -> None:
            while self.provisional and not self.guard.shut_down:
                time.sleep(interval)
                try:
                    moved = self.provisional and self._issued() > before
                except Exception:
                    return
                if moved:
                    self._withdraw()
                    return

        threading.Thread(target=watch, name="distdoctor-guard-went-on", daemon=True).start()

    def _withdraw(self) -> None:
        """The rank went on after its failed call: its final is no longer its last word."""
        guard = self.guard
        self.provisional = False
        side = guard.watch.side if guard.watch is not None else None
        try:
            if side is not None:
                side.forget([side.key("final", guard.rank)])
        except Exception as exc:  # the store is gone: nobody reads the final either
            guard.fault("store channel", exc)
        guard.final_left = False

    def withdrawn(self) -> bool:
        """At a clean shutdown: True when the final left by a failed call is to be replaced (the user's
        code caught the error and the rank left normally)."""
        was, self.provisional = self.provisional, False
        return was
