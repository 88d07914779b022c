"""The pure core imports only the standard library, numpy and PyYAML (DESIGN.md, rules of the house)."""
import pkgutil
import subprocess
import sys
import textwrap

import gyre_hpc

#: Edge modules (and packages) that may import torch, MPI, Mooncake, submitit, matplotlib, sockets...
EDGE_PREFIXES = (
    "gyre_hpc.train", "gyre_hpc.engines", "gyre_hpc.localengine", "gyre_hpc.transfer", "gyre_hpc.live", "gyre_hpc.proxy",
    "gyre_hpc.report", "gyre_hpc.net.serving", "gyre_hpc.cli", "gyre_hpc.slurm.submit", "gyre_hpc.trajectory.collate",
    "gyre_hpc.allocator.mpi_transport", "gyre_hpc.allocator.server",
    "gyre_hpc.agents.harness", "gyre_hpc.agents.closed_loop",
    "gyre_hpc.agents.grader", "gyre_hpc.agents.plugins", "gyre_hpc.agents.task_check", "gyre_hpc.agents.sandbox_launch",
    "gyre_hpc.agents.mswea",  # mswea and mswea_runner (run by the mini-swe-agent venv only)
    "gyre_hpc.train.hf_weights", "gyre_hpc.train.hf_io", "gyre_hpc.models.check", "gyre_hpc.models.export",
)
BLOCKED = ("torch", "megatron", "mpi4py", "sglang", "mooncake", "submitit", "matplotlib", "tqdm", "transformers",
           "tokenizers", "safetensors")


def core_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(gyre_hpc.__path__, "gyre_hpc.")]
    return sorted(n for n in names if not n.startswith(EDGE_PREFIXES))


def test_core_modules_import_without_heavy_dependencies():
    modules = core_modules()
    assert "gyre_hpc.config" in modules
    code = textwrap.dedent(f"""
        import importlib, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in {BLOCKED!r}:
                    raise ImportError('core module imported blocked package ' + name)
        sys.meta_path.insert(0, Block())
        for m in {modules!r}:
            importlib.import_module(m)
        print(len({modules!r}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(modules)
