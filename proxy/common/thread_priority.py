"""A lower CPU priority for the store's writer thread, so that the event loop comes first.

The writer shares the machine, often one core, with the event loop that relays traffic. At the
same priority the kernel splits the core between them: a write of a second's rows at saturation
(some 50-100 ms of CPU) slows every request and chunk relayed meanwhile, by half. (The admin SQL
threads keep their priority: a person waits for their answers, and a web UI page gives up on a
503 when they queue.) With the thread's nice value raised by `BACKGROUND_NICE` the
kernel's scheduler (CFS: weight 1024 against 335 at nice 5) gives the loop three quarters of a
contended core and the thread the rest: enough for the writer to keep up at saturation (it needs
about a tenth), and nothing is taken when the loop is idle. The GIL knows no priority: while the
writer holds it the loop waits, and a busier core makes that wait longer. Measured (#32, wrk -c64,
a normal-priority spinner on the relay's core): the p99 and the req/s as without the nice.

Linux only (a thread is a task with a nice value of its own, `setpriority` on its id); elsewhere,
or where the kernel refuses, the thread keeps its priority.
"""

from __future__ import annotations

import os
import sys
import threading

BACKGROUND_NICE = 5


def lower_this_thread() -> bool:
    """Raise the calling thread's nice value by BACKGROUND_NICE (once per thread: call it where the
    thread starts). False where it cannot be done."""
    if sys.platform != "linux" or not hasattr(os, "setpriority"):
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except OSError:
        return False
    return True
