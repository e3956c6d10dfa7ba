"""A command stopped by a signal: SIGINT (Ctrl-C) and SIGTERM (``kill``, a service manager) unwind it as an exception,
so that its cluster is closed, its locks released and its last checkpoint kept; the command then exits 130 or 143."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["STOP_SIGNALS", "Interrupted", "exit_status", "stop_signals_raise"]

#: The signals that stop a command.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop signal a command took, raised in its main thread. A ``KeyboardInterrupt``, so that what treats Ctrl-C
    as an interruption rather than a failure (a fit keeps its record for ``--resume``) treats SIGTERM alike."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a command the signal ended: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


class _Handler:
    """The first stop signal raises :class:`Interrupted`; a second, while the command is still stopping, says what
    it is waiting for; a third ends the process at once (its lock is then left, for the next fit to break).

    Python runs a handler between two bytecodes of the main thread, wherever they are, and an exception raised in a
    garbage collector's callback (``distributed`` installs one), a ``__del__`` or a weakref callback is printed and
    dropped, not raised: a fit went on iterating after its SIGTERM. So while the handler is installed,
    :meth:`unraisable` watches for its own exception being dropped, and has the signal sent again a moment later,
    when that code has returned; the handler then raises it again without counting it as another signal."""

    #: How long after a dropped :class:`Interrupted` the signal is sent again: past the code that dropped it.
    REDELIVER_AFTER = 0.05

    def __init__(self) -> None:
        self.received: list[int] = []
        self.redelivering = False  # the next signal is our own resend of a dropped Interrupted, not a new one
        self.previous_hook: Callable[[Any], Any] = sys.unraisablehook

    def __call__(self, signum: int, frame: Any) -> None:
        if self.redelivering:
            self.redelivering = False
            raise Interrupted(self.received[0])
        self.received.append(signum)
        if len(self.received) == 1:
            raise Interrupted(signum)
        if len(self.received) == 2:
            # os.write, not print: the handler may run while the main thread is inside a print to stderr.
            os.write(2, b"dist-respattn: still stopping (closing the cluster, finishing a checkpoint being written); "
                        b"once more to stop at once\n")  # fmt: skip
            return
        os._exit(128 + self.received[0])

    def unraisable(self, unraisable: Any) -> None:
        """``sys.unraisablehook`` while the handler is installed: our own :class:`Interrupted`, dropped where
        Python cannot raise, is sent again (by a timer thread: a signal sent from here could run its handler inside
        this very hook, and be dropped again); anything else goes to the hook that was there before."""
        if not isinstance(unraisable.exc_value, Interrupted):
            self.previous_hook(unraisable)
            return
        self.redelivering = True
        resend = threading.Timer(self.REDELIVER_AFTER, os.kill, (os.getpid(), unraisable.exc_value.signum))
        resend.daemon = True
        resend.start()


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread for the block (see :class:`_Handler`), unless
    they were ignored; the handlers it found are put back after it. Elsewhere than in the main thread, the block runs
    as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal ignored by whoever started the command (``nohup``, a shell's background job) stays ignored.
    previous = {signum: before for signum in STOP_SIGNALS if (before := signal.getsignal(signum)) is not signal.SIG_IGN}
    handler = _Handler()
    for signum in previous:
        signal.signal(signum, handler)
    sys.unraisablehook = handler.unraisable
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, signal.SIG_DFL if before is None else before)
        if sys.unraisablehook is handler.unraisable:
            sys.unraisablehook = handler.previous_hook
