"""One process of the load harness (``load.py``), run as a script: ``python -I _load_worker.py JSON``.

Standard library only, and run by path rather than as a module, so that it starts in
milliseconds and imports neither autotailor nor torch. It prints ``ready`` once its load is in
place and stops by itself at its deadline, or when its parent is gone, so that no load outlives
the harness even if the harness is killed.

``{"kind": "cpu", "schedule": [[t, duty], ...], "period_ms": 100, "start": T0, "end": T1, "ppid": P}``
spins for ``duty`` of every period (the duty in force at ``time.time() - start``) and sleeps the rest.
``{"kind": "memory", "mb": N, "end": T1, "ppid": P}`` allocates N MB, writes to every page, and holds it.
"""

import json
import os
import sys
import time


def duty_at(schedule, t):
    duty = 0.0
    for at, d in schedule:
        if t < at:
            break
        duty = d
    return duty


def alive(spec):
    return time.time() < spec["end"] and os.getppid() == spec["ppid"]


def cpu(spec):
    period = spec["period_ms"] / 1000
    print("ready", flush=True)
    x = 0
    while alive(spec):
        t0 = time.time()
        busy_until = t0 + period * duty_at(spec["schedule"], t0 - spec["start"])
        while time.time() < busy_until:
            for i in range(200):
                x += i * i
        rest = t0 + period - time.time()
        if rest > 0:
            time.sleep(rest)


def memory(spec):
    size = int(spec["mb"] * 2**20)
    buf = bytearray(size)
    for i in range(0, size, 4096):  # touch every page: bytearray's zeros are not resident yet
        buf[i] = 1
    print("ready", flush=True)
    while alive(spec):
        time.sleep(0.05)
    del buf


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    if spec.get("nice") is not None:  # absolute: a child starts at its parent thread's nice value
        os.setpriority(os.PRIO_PROCESS, 0, spec["nice"])
    {"cpu": cpu, "memory": memory}[spec["kind"]](spec)
