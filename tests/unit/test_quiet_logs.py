"""Third-party noise is dropped by default and shown with --verbose; the setting reaches child processes."""
import os
import subprocess
import sys
import textwrap

import pytest

from gyre_hpc.cli import build_parser

NOISE = (b"WARNING: Logging before InitGoogleLogging() is written to STDERR\n"
         b"E1201 21:57:47.894724  3569 transfer_metadata.cpp:1098] Local segment descriptor not found\n")


def python(code: str, verbose: str | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with GYRE_VERBOSE set to ``verbose`` (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k != "GYRE_VERBOSE"}
    if verbose is not None:
        env["GYRE_VERBOSE"] = verbose
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, env=env, timeout=60)


NATIVE = f"""
    import os, sys
    from gyre_hpc.launcher.quiet import MOONCAKE_NOISE, native_stderr_filtered
    os.write(2, b"before\\n")
    try:
        with native_stderr_filtered(MOONCAKE_NOISE):
            os.write(2, b"kept 1\\n" + {NOISE!r} + b"E1201 22:00:00.1 1 transfer_metadata.cpp:9] a real error\\n")
            print("python line", file=sys.stderr)
            raise ValueError("the engine failed")
    except ValueError:
        os.write(2, b"after\\n")
"""


def test_quiet_mode_drops_only_mooncake_startup_noise_and_keeps_the_rest_in_order():
    out = python(NATIVE)
    assert out.returncode == 0, out.stderr
    assert out.stderr == (b"before\nkept 1\nE1201 22:00:00.1 1 transfer_metadata.cpp:9] a real error\n"
                          b"python line\nafter\n")


@pytest.mark.parametrize("value", ["1", "true"])
def test_verbose_mode_keeps_every_line(value):
    out = python(NATIVE, verbose=value)
    assert NOISE in out.stderr and out.stderr.startswith(b"before\nkept 1\n") and out.stderr.endswith(b"after\n")


WARN = """
    import warnings
    from gyre_hpc.launcher import quiet
    print(quiet.configure({flag}))
    warnings.warn_explicit("coroutine 'connect_tcp.<locals>.try_connect' was never awaited", RuntimeWarning,
                           "anyio/_core/_sockets.py", 1)
    warnings.warn_explicit("coroutine 'ours' was never awaited", RuntimeWarning, "gyre_hpc/x.py", 1)
"""


def test_quiet_mode_ignores_the_anyio_warning_but_not_others():
    out = python(WARN.format(flag=False))
    assert out.stdout == b"False\n" and b"try_connect" not in out.stderr and b"'ours' was never" in out.stderr
    shown = python(WARN.format(flag=True))
    assert shown.stdout == b"True\n" and b"try_connect" in shown.stderr


def test_verbose_flag_reaches_child_processes_and_an_inherited_setting_stands():
    child = ("import subprocess, sys; "
             "subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"GYRE_VERBOSE\"))'])")
    code = f"from gyre_hpc.launcher import quiet; quiet.configure({{flag}}); exec({child!r})"
    assert python(code.format(flag=True)).stdout == b"1\n"  # --verbose: exported to the child
    assert python(code.format(flag=False)).stdout == b"None\n"  # default: quiet everywhere
    assert python(code.format(flag=False), verbose="1").stdout == b"1\n"  # a rank keeps what its launcher chose


@pytest.mark.parametrize("command", ["train", "submit", "sweep"])
def test_commands_that_start_third_party_code_take_verbose(command):
    args = build_parser([command]).parse_args([command, "configs/local.yaml", "--verbose"])
    assert args.verbose is True
