"""The job secret and run keys (gyre_hpc/net/auth.py): what each token grants, and the secret file's mode."""
from __future__ import annotations

import os
import stat

from gyre_hpc.net import auth

SECRET = "s3cret-of-the-job"


def test_the_job_secret_grants_the_whole_job():
    assert auth.grant(f"Bearer {SECRET}", SECRET) == auth.Grant() and auth.Grant().job
    assert auth.grant(f"bearer   {SECRET} ", SECRET, run_keys=True).job


def test_a_missing_malformed_or_wrong_token_grants_nothing():
    for header in (None, "", "Bearer", "Bearer ", f"Basic {SECRET}", SECRET, f"Bearer {SECRET}x", "Bearer s3cret"):
        assert auth.grant(header, SECRET, run_keys=True) is None, header


def test_a_run_key_grants_exactly_its_run_and_only_where_run_keys_are_accepted():
    key = auth.run_key(SECRET, "q3-r1")
    assert auth.grant(f"Bearer {key}", SECRET, run_keys=True) == auth.Grant("q3-r1")
    assert not auth.grant(f"Bearer {key}", SECRET, run_keys=True).job
    assert auth.grant(f"Bearer {key}", SECRET) is None  # an engine accepts the job secret only
    assert SECRET not in key


def test_a_run_key_altered_in_its_run_id_or_its_mac_grants_nothing():
    key = auth.run_key(SECRET, "q3-r1")
    prefix, mac = key.rsplit(".", 1)
    forged = [key.replace("q3-r1", "q3-r2"), f"{prefix}.{mac[:-1]}{'0' if mac[-1] != '0' else '1'}",
              auth.run_key("another-secret", "q3-r1"), "run..", "run.q3-r1."]
    for token in forged:
        assert auth.grant(f"Bearer {token}", SECRET, run_keys=True) is None, token


def test_run_ids_with_dots_and_slashes_keep_their_own_keys():
    for run_id in ("a.b.c", "q/1", "x-y_z"):
        assert auth.grant(f"Bearer {auth.run_key(SECRET, run_id)}", SECRET, run_keys=True) == auth.Grant(run_id)


def test_ensure_secret_generates_once_and_keeps_it_in_the_environment():
    env: dict[str, str] = {}
    first = auth.ensure_secret(env)
    assert env[auth.ENV] == first and len(first) >= 40
    assert auth.ensure_secret(env) == first and auth.job_secret(env) == first
    assert auth.ensure_secret({}) != first


def test_the_secret_file_is_readable_by_its_owner_only_even_if_it_existed_wider(tmp_path):
    path = tmp_path / auth.SECRET_FILE
    path.write_text("old")
    os.chmod(path, 0o644)
    assert auth.write_secret(tmp_path, SECRET) == path
    assert path.read_text() == SECRET and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_refusal_says_how_to_get_a_key_and_names_a_foreign_run_key_without_echoing_it():
    foreign = auth.run_key("another servers secret", "agent-7")
    message = auth.refusal(f"Bearer {foreign}", run_keys=True)
    assert auth.grant(f"Bearer {foreign}", SECRET, run_keys=True) is None
    assert "'agent-7'" in message and "gyre serve CONFIG --run RUN_ID" in message
    assert foreign not in message and SECRET not in message
    for header in (None, "Bearer wrong", "Basic x"):
        assert "export OPENAI_API_KEY" in auth.refusal(header, run_keys=True)
    assert auth.refusal("Bearer wrong") == "missing or wrong credentials: send Authorization: Bearer <job secret>"
