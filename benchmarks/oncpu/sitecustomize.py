"""An on-CPU sampler for every Python process of a run (measurement only; issue 14: where a live test's CPU goes).

    GYRE_SAMPLE_DIR=/tmp/s PYTHONPATH=$PWD:$PWD/benchmarks/oncpu python -m gyre_hpc.cli train ... --json
    python benchmarks/oncpu_report.py /tmp/s

With GYRE_SAMPLE_DIR set, every Python process that inherits this PYTHONPATH (ranks, engines, proxy) runs a
daemon thread that, every 10 ms, records the Python stack of each of its threads whose /proc state is R
(running or runnable), and writes ``{argv, counts: {stack: samples}, cpu, threads: {name: cpu s}}`` to
GYRE_SAMPLE_DIR/<pid>.json every 2 s and at exit. Without GYRE_SAMPLE_DIR it does nothing.

Caveats: R includes waiting for a core, so on a loaded machine threads that wake often are over-represented
(compare against the per-thread CPU seconds in ``threads``); native threads without a Python frame are not
seen; the sampler itself costs about 0.1-0.8 CPU s per process.
"""
import os

if os.environ.get("GYRE_SAMPLE_DIR"):
    import atexit
    import collections
    import json
    import sys
    import threading
    import time

    _DIR = os.environ["GYRE_SAMPLE_DIR"]
    _PID = os.getpid()
    _TICK = os.sysconf("SC_CLK_TCK")
    _counts: collections.Counter = collections.Counter()
    _thread_cpu: dict = {}

    def _stat(tid):
        try:
            with open(f"/proc/{_PID}/task/{tid}/stat") as f:
                s = f.read()
        except (OSError, TypeError):
            return None
        return s[s.rindex(")") + 2:].split()

    def _threads_cpu():
        for t in threading.enumerate():
            f = _stat(t.native_id)
            if f is not None:
                _thread_cpu[f"{t.name}:{t.native_id}"] = (int(f[11]) + int(f[12])) / _TICK

    def _dump():
        _threads_cpu()
        try:
            with open(f"{_DIR}/{_PID}.json", "w") as f:
                json.dump({"argv": getattr(sys, "orig_argv", sys.argv), "counts": dict(_counts),
                           "cpu": time.process_time(), "threads": _thread_cpu}, f)
        except Exception:  # noqa: BLE001 (a measurement must never break the process it measures)
            pass

    def _loop():
        me, n = threading.get_ident(), 0
        while os.getpid() == _PID:
            time.sleep(0.01)
            n += 1
            ids = {t.ident: t.native_id for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                f = _stat(ids.get(ident)) if ident != me else None
                if f is None or f[0] != "R":
                    continue
                stack = []
                while frame is not None and len(stack) < 40:
                    c = frame.f_code
                    stack.append(f"{os.path.basename(c.co_filename)}:{c.co_name}:{frame.f_lineno}")
                    frame = frame.f_back
                _counts[";".join(reversed(stack))] += 1
            if n % 200 == 0:
                _dump()

    threading.Thread(target=_loop, daemon=True, name="gyre-sampler").start()
    atexit.register(_dump)
