"""Entry points of the ``gyre`` command, one module per subcommand; each reads top to bottom."""

import argparse

from gyre_hpc.config import overlay_overrides
from gyre_hpc.errors import ConfigError


class _Overlay(argparse.Action):
    """``--overlay FILE``: the file's keys join ``args.overrides`` where it stands among the ``--set`` options."""

    def __call__(self, parser, namespace, value, option_string=None):
        try:
            sets = overlay_overrides(value)
        except ConfigError as exc:
            parser.error(f"--overlay: {exc}")
        namespace.overrides = list(getattr(namespace, "overrides", None) or []) + sets


def add_overrides(p: argparse.ArgumentParser, example: str, note: str = "") -> None:
    """The ``--set KEY=VALUE`` option every config-driven command takes (collected in ``args.overrides``)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config key (repeatable), e.g. --set {example}{note}")
    p.add_argument("--overlay", action=_Overlay, metavar="FILE", dest="overrides",
                   help="a YAML overlay (a partial config, e.g. written by gyre tune): its keys as --set, in order")
