"""Entry points of the ``gyre`` command, one module per subcommand; each reads top to bottom."""

import argparse


def add_overrides(p: argparse.ArgumentParser, example: str, note: str = "") -> None:
    """The ``--set KEY=VALUE`` option every config-driven command takes (collected in ``args.overrides``)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config key (repeatable), e.g. --set {example}{note}")
