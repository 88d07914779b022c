"""README's Layout section names every package of gyre_hpc (as ``gyre_hpc/a/b/``), so the map stays the tree."""
import pkgutil
from pathlib import Path

import gyre_hpc

README = Path(__file__).resolve().parents[2] / "README.md"


def layout_section() -> str:
    text = README.read_text()
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_every_package_is_named_in_the_readme_layout():
    layout = layout_section()
    packages = [m.name for m in pkgutil.walk_packages(gyre_hpc.__path__, "gyre_hpc.") if m.ispkg]
    assert packages, "no packages found under gyre_hpc"
    assert [name for name in packages if name.replace(".", "/") + "/" not in layout] == []
