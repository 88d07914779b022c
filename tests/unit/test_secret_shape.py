"""A generated job secret never starts with '-' (SGLang's --config expands it into ``--api-key VALUE`` and argparse
takes a leading '-' for an option: the server exits at start)."""
import secrets

from gyre_hpc.net import auth


def test_a_generated_secret_never_starts_with_a_dash(monkeypatch):
    tokens = iter(["-starts-with-dash", "-again", "fine-token"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(tokens))
    assert auth.new_secret() == "fine-token"
    monkeypatch.undo()
    assert not any(auth.new_secret().startswith("-") for _ in range(500))
