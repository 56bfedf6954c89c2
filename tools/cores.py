"""Each of several processes running at once gets its share of the machine's cores for torch's threads."""

from __future__ import annotations

import os


def share_among(processes: int) -> None:
    """Set OMP_NUM_THREADS to this machine's cores over ``processes`` (at least 1) in this process's environment,
    before torch is imported here; the processes it starts inherit it. With torch's default of a thread per core
    in each, processes sharing the cores wait on each other's threads. A user's value stands."""
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // max(1, processes))))
