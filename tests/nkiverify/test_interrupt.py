"""Ctrl-C during ``nki-verify`` and ``nki-verify course`` with worker processes: the workers
stop at once (not after their running cases: a 224x224 conv2d case runs for a minute), the
results so far are printed with "interrupted" as the reason, and the exit status is 130. A
second Ctrl-C neither hangs nor prints a traceback (it did both: concurrent.futures' exit
handler joined the busy workers, and the second KeyboardInterrupt broke that join)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from test_student import _checkout

# a fast case and a long one (B=4 224x224: tens of seconds of simulation per run)
CASES = "naive-n128,conv2d-large"


def _start(args, cwd, stdout):
    env = dict(os.environ, PYTHONPATH="")
    # a session of its own: a terminal's Ctrl-C goes to the whole process group (stdout to a
    # file: a hung process must not hang the test on reading it)
    return subprocess.Popen([sys.executable, "-m", "nkiverify.cli", *args], cwd=cwd, env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _group_alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("command,how", [("course", "group twice"), ("run", "group once"),
                                         ("run", "main process only")])
def test_ctrl_c_stops_the_workers_and_prints_the_results_so_far(tmp_path, command, how):
    root = _checkout(tmp_path / "asst4", drop_bias=False)
    args = (["course", str(root), "--cases", CASES] if command == "course" else
            ["run", "--cases", CASES, "--dtypes", "float32", "--dialect", "beta1"]) + ["-j", "2"]
    out_path = tmp_path / "stdout.txt"
    with open(out_path, "w") as out_file:
        proc = _start(args, cwd=tmp_path, stdout=out_file)
    err_lines, first_done = [], threading.Event()

    def read_stderr():
        for line in proc.stderr:
            err_lines.append(line)
            if "naive-n128" in line and "PASS" in line:
                first_done.set()
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert first_done.wait(180), "".join(err_lines)
        time.sleep(1.0)          # the conv2d-large run is under way in the other worker
        t0 = time.monotonic()
        if how == "main process only":      # kill -INT PID, timeout -s INT
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
            if how == "group twice":
                time.sleep(0.3)
                if _group_alive(proc.pid):
                    os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        elapsed = time.monotonic() - t0
        out = out_path.read_text()
        reader.join(10)
        err = "".join(err_lines)
        assert rc == 130, out + err
        assert elapsed < 10, f"{elapsed:.1f} s after the Ctrl-C\n{out}{err}"
        assert not _group_alive(proc.pid), "worker processes left running"
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert "interrupted; results so far" in err
        if command == "course":
            assert "PASS  naive" in out
            # (the kernels --cases left out are "not checked (--cases)"; conv2d is not)
            assert "conv2d    0/0 cases  (part2/conv2d.py:fused_conv2d_maxpool)  " \
                "not checked (interrupted)" in out
            assert "every case" not in out
        else:
            assert "1 passed, 0 failed, 1 not run (interrupted)" in out
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
