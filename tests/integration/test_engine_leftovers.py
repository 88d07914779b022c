"""``engines.leftovers``: after a live run, a process whose standard output is one of the run's engine logs (an
SGLang detokenizer that outlived its killed server) is found and SIGKILLed by PID; any other process is not."""
import subprocess
import sys

from gyre_hpc.engines.leftovers import kill_left_behind, left_behind


def _sleeper(log_path):
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=log, stderr=log,
                                start_new_session=True)


def test_a_process_writing_to_an_engine_log_of_the_run_is_killed_and_others_are_not(tmp_path):
    run = tmp_path / "run"
    orphan = _sleeper(run / "cells" / "cell0" / "engine-1.log")
    other_run = _sleeper(tmp_path / "other" / "cells" / "cell0" / "engine-1.log")
    not_an_engine = _sleeper(run / "cells" / "cell0" / "notes.log")
    try:
        assert left_behind(run) == [orphan.pid]
        assert kill_left_behind(run) == [orphan.pid]
        assert orphan.wait(timeout=30) == -9
        assert other_run.poll() is None and not_an_engine.poll() is None
        assert left_behind(run) == []
    finally:
        for p in (orphan, other_run, not_an_engine):
            p.kill()
            p.wait(timeout=30)
