"""The import contract (.importlinter) covers the tree: every module of gyre_hpc sits in exactly one layer of the
``layers`` contract, and every module a contract names exists (a moved module leaves no stale name behind)."""
import configparser
import importlib.util
import pkgutil
from pathlib import Path

import gyre_hpc

CONTRACT = Path(__file__).resolve().parents[2] / ".importlinter"


def contract() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(CONTRACT)
    return parser


def names(value: str) -> list[str]:
    """The module names of one option: one per line, a layer's independent siblings split at ``|``."""
    return [name.strip() for line in value.splitlines() for name in line.split("|") if name.strip()]


def modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(gyre_hpc.__path__, "gyre_hpc."))


def test_every_module_sits_in_exactly_one_layer():
    layers = [name for name in names(contract()["importlinter:contract:layers"]["layers"])
              if name.startswith("gyre_hpc.")]
    homes = {m: [layer for layer in layers if m == layer or m.startswith(layer + ".")] for m in modules()}
    assert {m: h for m, h in homes.items() if len(h) != 1} == {}


def test_every_module_a_contract_names_exists():
    parser = contract()
    known = set(modules())
    named = {name for section in parser.sections() if section.startswith("importlinter:contract:")
             for option in ("layers", "source_modules", "forbidden_modules") if option in parser[section]
             for name in names(parser[section][option])}
    missing = {name for name in named if name.startswith("gyre_hpc.") and name not in known}
    missing |= {name for name in named if name == "jobs" and importlib.util.find_spec(name) is None}
    assert missing == set()
