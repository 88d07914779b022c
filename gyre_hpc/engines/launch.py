"""Start and stop engine processes; a started engine is ready only once ``/health`` answers 200.

``start_local_engine`` runs ``python -m gyre_hpc.localengine.server`` with a config file holding exactly the sections
the engine reads (``engine``, ``model``, ``run.seed``); ``start_engine`` picks the local engine or SGLang's
``sglang.launch_server`` by ``engine.kind``.

Invariants
- ``start_*`` returns only a ready engine: it waits on ``/health`` up to ``engine.startup_timeout_s``; when the
  process exits or the time runs out it stops the process and raises ``EngineError`` with the log's tail. The
  answer counts only when the started process tree listens on that port: another process that took the port
  first (and answers its own ``/health``) fails the start as ``PORT_TAKEN``, so ``on_free_port`` tries another.
- ``EngineHandle.stop()`` ends exactly the process group it started (``children.stop``): SIGTERM, then SIGKILL
  after a grace period, to the group again, so no grandchild is left (an SGLang server stopped while it starts
  leaves its detokenizer otherwise). A started engine dies with the process that started it (``children.spawn``).
- The job secret reaches the engine through its environment only; SGLang gets it as ``api-key`` in a 0600
  config file (``--config``), never on its command line.
- Files a start writes where the caller named no place (the config, SGLang's secret file, the log) live in one
  private scratch directory the handle owns (``scratch``); ``stop()`` removes it, also after a failed start, so
  neither engine configs nor the job secret pile up in the temporary directory. An SGLang server's TMPDIR is its
  scratch when that is in the temporary directory (and leaves room for a unix socket's name), so its own
  temporary files (ipc sockets) go with it; never in a run directory, which may be on a shared file system.
- An engine never inherits the caller's torch.distributed rendezvous variables (``DIST_ENV``): started from a
  trainer process it still forms its own one-process world.
- ``start_engine_on_free_port`` (``on_free_port`` for any start function: tests, the proxy) retries on another free
  port only when the engine could not bind its port (another process took it between ``free_port`` and the bind)
  or a signal killed it while it started (``KILLED_STARTING``, local engine only: SGLang SIGKILLs itself on a
  failed start; a dead engine is restarted, tests/integration/test_engine_start_retry.py); any other failure
  raises at once. A failed bind is read from the log (``PORT_TAKEN``) and fails the start at once, also when the
  process does not exit; an SGLang start whose port is already taken fails before the server starts (it would
  bind only after loading the model, ``require_port_free``).
- A live run's engine keeps its config beside its log in the cell directory (``config_dir``; SGLang's, with the
  job secret, in a private scratch there), so a cell rank killed by SIGKILL leaves no secret and no config in the
  temporary directory (a job whose one cell fails kills the others' ranks while their servers start).
- An engine that cannot start raises ``EngineError`` naming it (``name``, e.g. the cell, and its kind) with the tail
  of its log; SGLang on a CPU (``engine.device`` cpu, or auto without CUDA) runs with ``SGLANG_USE_CPU_ENGINE=1``,
  ``--device cpu`` and a bounded ``--max-total-tokens``.
"""
from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence
from urllib.parse import urlsplit

import yaml

from gyre_hpc.net import auth
from gyre_hpc.clock import wait_until
from gyre_hpc.config import EngineConfig, GyreConfig, ModelConfig, RunConfig, to_dict
from gyre_hpc.engines import children
from gyre_hpc.engines.children import ignore_preemption_signal  # noqa: F401  (re-exported)
from gyre_hpc.engines.client import EngineClient
from gyre_hpc.errors import EngineError
from gyre_hpc.files.io import atomic_write_text


#: torch.distributed rendezvous variables a launched engine does not inherit.
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class EngineHandle:
    url: str
    process: subprocess.Popen
    log_path: Path
    name: str = "engine"
    log_start: int = 0  # size of the log before this start (a log file can be shared by successive starts)
    scratch: Path | None = None  # a private temporary directory of this start's files: removed by stop()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def client(self, **kwargs) -> EngineClient:
        """An ``EngineClient`` for this engine (keyword arguments as ``EngineClient``'s)."""
        return EngineClient(self.url, **kwargs)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _log_ref(self) -> str:
        """How an error names the log: its path, unless it lives in the scratch that ``stop()`` removes."""
        if self.scratch is not None and self.log_path.parent == self.scratch:
            return "its log (removed with the process)"
        return f"log {self.log_path}"

    def _log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM the engine's process group, SIGKILL it after ``grace_s``; returns the engine's exit status.
        The handle's ``scratch`` directory goes with it."""
        try:
            return children.stop(self.process, grace_s)
        finally:
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)

    def wait_ready(self, timeout_s: float) -> None:
        """Return once ``/health`` answers; raise ``EngineError`` (with the log's tail) when the process exits, fails
        to bind its port or is not ready within ``timeout_s``. The caller stops it (``spawn_ready`` does)."""
        with EngineClient(self.url, connect_retries=0) as client:
            def ready() -> bool:
                if not self.alive():
                    rc = self.process.returncode
                    how = f" ({KILLED_STARTING} {_signal_name(-rc)})" if rc is not None and rc < 0 else ""
                    raise EngineError(f"{self.name} at {self.url} exited with {rc}{how} before it "
                                      f"was ready; {self._log_ref()}:\n{self.log_tail()}")
                if client.health(timeout=2.0):
                    if not self._listens_on_its_port():  # another process took the port and answers instead
                        raise EngineError(f"{self.name} at {self.url}: another process answers there ({PORT_TAKEN} "
                                          f"for this one); {self._log_ref()}:\n{self.log_tail()}")
                    return True
                if PORT_TAKEN in self._log_since_start():  # SGLang logs the failed bind, then hangs in shutdown
                    raise EngineError(f"{self.name} at {self.url} could not bind its port; {self._log_ref()}:\n"
                                      f"{self.log_tail()}")
                return False

            if wait_until(ready, timeout_s, poll_s=0.2):
                return
        raise EngineError(f"{self.name} at {self.url} not ready after {timeout_s:.0f} s; {self._log_ref()}:\n"
                          f"{self.log_tail()}")

    def _listens_on_its_port(self) -> bool:
        """Whether this process (or one of its children: SGLang serves from a child) listens on the URL's port. A
        port ``free_port`` found free can be bound by another process before this one binds it (a busy machine,
        many jobs); its ``/health`` would answer for this one. True when the kernel will not say (no psutil, a
        process that is not ours to inspect)."""
        try:
            import psutil
        except ImportError:
            return True
        port = urlsplit(self.url).port
        try:
            root = psutil.Process(self.process.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return True
        for proc in procs:
            try:
                if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                       for c in proc.net_connections(kind="tcp")):
                    return True
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                return True
        return False

    def __enter__(self) -> "EngineHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scratch_dir(kind: str, parent: str | Path | None = None) -> Path:
    """A new private (0700) directory for one start's files, in ``parent`` (default: the temporary directory);
    the handle removes it (``stop``)."""
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"gyre-{kind}-", dir=parent))


def spawn_ready(cmd: list[str], url: str, log_path: Path | None, timeout_s: float, name: str = "engine",
                env: dict[str, str] | None = None, scratch: Path | None = None) -> EngineHandle:
    """Run ``cmd`` in its own process group, logging to ``log_path`` (default: ``process.log`` in ``scratch``), and
    return its handle once ``/health`` answers; a start that fails is stopped (``scratch`` removed) and raises."""
    if log_path is None:
        scratch = scratch if scratch is not None else scratch_dir("process")
        log_path = scratch / "process.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log_start = log.tell()
        try:
            proc = children.spawn(cmd, log, env if env is not None else children.child_env())
        except BaseException:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
    handle = EngineHandle(url, proc, Path(log_path), name, log_start=log_start, scratch=scratch)
    try:
        handle.wait_ready(timeout_s)
    except BaseException:
        handle.stop()
        raise
    return handle


def _spawn(cmd: list[str], url: str, log_path: Path | None, timeout_s: float, name: str = "engine",
           env_extra: dict[str, str] | None = None, scratch: Path | None = None) -> EngineHandle:
    # the engine is a world of its own: it must not join (or collide with) the caller's torch.distributed world
    env = children.child_env(drop=DIST_ENV) | (env_extra or {})
    return spawn_ready(cmd, url, log_path, timeout_s, name, env, scratch)


def start_local_engine(engine_cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0, index: int = 0,
                       port: int | None = None, log_path: str | Path | None = None,
                       config_dir: str | Path | None = None, name: str = "engine",
                       devices: str | None = None) -> EngineHandle:
    """Start the local engine on ``port`` (default ``engine.port_base + index``) and wait until it is healthy;
    ``devices``: its ``CUDA_VISIBLE_DEVICES`` (``device_env``)."""
    port = port if port is not None else engine_cfg.port_base + index
    cfg = GyreConfig(run=RunConfig(seed=seed), engine=engine_cfg, model=model_cfg)
    data = {k: v for k, v in to_dict(cfg).items() if k in ("run", "engine", "model")}
    scratch = scratch_dir("engine") if config_dir is None else None
    # beside a named log, named after it (cells/cell1/engine-3.yaml is engine-3.log's); a retry on another port
    # rewrites the same config
    beside_log = log_path is not None and config_dir is not None
    config_name = f"{Path(log_path).stem}.yaml" if beside_log else f"engine-{port}.yaml"
    config_path = atomic_write_text(Path(config_dir or scratch) / config_name, yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "gyre_hpc.localengine.server", "--host", engine_cfg.host, "--port", str(port),
           "--config", str(config_path)]
    url = f"http://{engine_cfg.host}:{port}"
    return _spawn(cmd, url, Path(log_path) if log_path else None, engine_cfg.startup_timeout_s,
                  f"{name} (local engine)", device_env(devices), scratch=scratch)


def sglang_secret_config(directory: str | Path, port: int) -> Path:
    """A 0600 YAML file ``{api-key: <job secret>}`` for SGLang's ``--config`` (it then requires the key as a
    Bearer token on every route, as the local engine does), so the secret stays off the command line."""
    path = Path(directory) / f"sglang-{port}.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)
        yaml.safe_dump({"api-key": auth.ensure_secret()}, f)
    return path


#: longest TMPDIR an SGLang server gets: its ZMQ ipc sockets are ``$TMPDIR/tmpXXXXXXXX`` (12 more characters),
#: and a unix socket's path holds at most 107 (ZMQError "ipc path ... is longer than ..." otherwise)
SGLANG_TMPDIR_MAX = 90


def sglang_tmpdir(scratch: Path) -> dict[str, str]:
    """``{TMPDIR: scratch}``, so that SGLang's own temporary files (its ZMQ ipc sockets) go with the scratch instead of
    outliving a server that ends by SIGKILL (its failed starts do); nothing when the path is too long for them."""
    return {"TMPDIR": str(scratch)} if len(str(scratch)) <= SGLANG_TMPDIR_MAX else {}


def sglang_device(engine_cfg: EngineConfig) -> str:
    """``engine.device``, with ``auto`` resolved: cuda when torch sees a GPU, else cpu."""
    if engine_cfg.device != "auto":
        return engine_cfg.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sglang_command(engine_cfg: EngineConfig, port: int, device: str = "cuda",
                   config_path: str | Path | None = None) -> list[str]:
    """``sglang.launch_server`` for ``engine.model_path`` (an HF-format model directory), token ids in/out; on
    ``device`` cpu with ``--device cpu`` and ``--max-total-tokens`` (default max_running_requests x context_len);
    ``--sleep-on-idle`` as ``engine.sglang_sleep_on_idle`` says (null: on cpu only; an idle scheduler otherwise
    spins a whole core per server); ``--enable-memory-saver`` with ``engine.sleep_in_training`` off the cpu (SGLang
    frees GPU memory at /release_memory_occupation only with it; on cpu the call is a no-op either way);
    ``config_path`` (``sglang_secret_config``) carries the API key."""
    if engine_cfg.model_path is None:
        raise EngineError("engine.kind=sglang needs engine.model_path (an HF-format model directory)")
    secret = ["--config", str(config_path)] if config_path is not None else []
    cmd = [sys.executable, "-m", "sglang.launch_server", *secret, "--model-path", engine_cfg.model_path,
           "--host", engine_cfg.host, "--port", str(port), "--skip-tokenizer-init",
           "--max-running-requests", str(engine_cfg.max_running_requests),
           "--context-length", str(engine_cfg.context_len),
           "--weight-version", engine_cfg.initial_weight_version]
    if engine_cfg.tp > 1:  # one replica on engine.tp GPUs (CUDA_VISIBLE_DEVICES names them: device_env)
        cmd += ["--tp-size", str(engine_cfg.tp)]
    total = engine_cfg.max_total_tokens
    if device == "cpu":
        cmd += ["--device", "cpu"]
        total = total or engine_cfg.max_running_requests * engine_cfg.context_len
    if total is not None:
        cmd += ["--max-total-tokens", str(total)]
    sleep = engine_cfg.sglang_sleep_on_idle
    if sleep or (sleep is None and device == "cpu"):
        cmd += ["--sleep-on-idle"]
    if engine_cfg.sleep_in_training and device != "cpu" and "--enable-memory-saver" not in engine_cfg.sglang_args:
        cmd += ["--enable-memory-saver"]  # else /release_memory_occupation frees nothing on a GPU (a no-op adapter)
    return [*cmd, *engine_cfg.sglang_args]


def device_env(devices: str | None) -> dict[str, str]:
    """``{CUDA_VISIBLE_DEVICES: devices}`` for an engine replica on its own GPUs (``replicas.ReplicaSpec``);
    nothing without (a CPU replica, or a caller that leaves the GPUs as they are)."""
    return {} if devices is None else {"CUDA_VISIBLE_DEVICES": devices}


def sglang_env(device: str, tp: int = 1, cores: Sequence[int] | None = None) -> dict[str, str]:
    """Environment an SGLang server needs on ``device``: on cpu SGLANG_USE_CPU_ENGINE=1 (without it the server
    dies ~20 s in on ``No module named 'vllm'``), and with ``tp`` > 1 the cores of each TP rank
    (``SGLANG_CPU_OMP_THREADS_BIND``, ``omp_bind``; without it SGLang asserts one NUMA node per rank:
    docs/engines.md), unless the caller's environment already sets it."""
    if device != "cpu":
        return {}
    env = {"SGLANG_USE_CPU_ENGINE": "1"}
    if tp > 1 and not os.environ.get(OMP_BIND):
        env[OMP_BIND] = omp_bind(sorted(os.sched_getaffinity(0)) if cores is None else cores, tp)
    return env


#: SGLang's per-rank CPU core list on CPU (``|`` between ranks)
OMP_BIND = "SGLANG_CPU_OMP_THREADS_BIND"


def omp_bind(cores: Sequence[int], tp: int) -> str:
    """``cores`` split into ``tp`` contiguous groups, one per TP rank, as SGLang reads them: ``0-1|2-3``; an
    ``EngineError`` naming engine.tp when there are fewer cores than ranks."""
    cores = list(cores)
    if len(cores) < tp:
        raise EngineError(f"engine.tp={tp}: SGLang on CPU binds each TP rank to its own cores, and this process may "
                          f"use {len(cores)} ({cores}); use engine.tp <= {len(cores)}")
    size, extra = divmod(len(cores), tp)
    groups, at = [], 0
    for rank in range(tp):
        n = size + (rank < extra)
        groups.append(_ranges(cores[at:at + n]))
        at += n
    return "|".join(groups)


def _ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out, start = [], cores[0]
    for prev, cur in zip(cores, cores[1:] + [None]):
        if cur is None or cur != prev + 1:  # a run of consecutive cores ends at prev
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = cur
    return ",".join(out)


#: what the engine's log says when another process took its port first (uvicorn: "[Errno 98] ... address already in use")
PORT_TAKEN = "address already in use"
#: in the error of an engine that a signal ended while it started (an operator's or the OOM killer's SIGKILL): a
#: dead engine like one that dies serving, so its start is tried again (issue 15: a dead engine is restarted)
KILLED_STARTING = "killed by"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def on_free_port(start: Callable[..., EngineHandle], *args, host: str = "127.0.0.1", tries: int = 3,
                 retry_killed: bool = False, **kwargs) -> EngineHandle:
    """``start(*args, port=free_port(host), **kwargs)``, on another free port when the process could not bind its
    own (``PORT_TAKEN``: another process, or an outgoing connection's ephemeral port, took it between ``free_port``
    and the bind), ``tries`` times; with ``retry_killed`` also when a signal killed it while it started
    (``KILLED_STARTING``). Any other failure raises at once."""
    for _ in range(tries - 1):
        try:
            return start(*args, port=free_port(host), **kwargs)
        except EngineError as exc:
            if not (PORT_TAKEN in str(exc) or (retry_killed and KILLED_STARTING in str(exc))):
                raise
    return start(*args, port=free_port(host), **kwargs)  # the last try raises whatever it raises


def start_engine_on_free_port(engine_cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0,
                              log_path: str | Path | None = None, tries: int = 3, name: str = "engine",
                              config_dir: str | Path | None = None, devices: str | None = None) -> EngineHandle:
    """``start_engine`` on a port that ``free_port`` found free. On a shared machine another process can bind it
    before the engine does (seen in live runs); then the engine exits and another port is tried, ``tries`` times.
    A local engine a signal killed while it started is started again the same way (``KILLED_STARTING``); SGLang
    SIGKILLs its own process tree when its start fails (a bad model path), so that is not retried."""
    return on_free_port(start_engine, engine_cfg, model_cfg, seed, host=engine_cfg.host, tries=tries,
                        retry_killed=engine_cfg.kind == "local", log_path=log_path, name=name, config_dir=config_dir,
                        devices=devices)


def require_port_free(host: str, port: int, name: str) -> None:
    """Raise ``EngineError`` (with ``PORT_TAKEN``, so ``on_free_port`` tries another port) when something listens
    on ``host:port``: an SGLang server binds its port only after loading the model, a minute on CPU, and then
    hangs in its shutdown. The probe binds as uvicorn does (``SO_REUSEADDR``), so a port in TIME_WAIT is free."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return  # another reason (a host not on this machine): the server's own error says it
            raise EngineError(f"{name} at http://{host}:{port} could not bind its port ({PORT_TAKEN}): choose "
                              "another engine.port_base, or stop what listens there") from exc


#: the weight files SGLang's default ``--load-format auto`` loads (sglang/srt/model_loader/loader.py)
SGLANG_WEIGHTS = ("*.safetensors", "*.bin", "*.pt")


def require_weights(model_path: str | Path, name: str) -> None:
    """Raise ``EngineError`` unless ``model_path`` is a directory holding weights SGLang can load: it would take
    a missing directory for a hub name and try to download it, and find no weights only after importing itself
    (a minute or two on CPU)."""
    path = Path(model_path)
    if not path.is_dir():
        raise EngineError(f"{name}: engine.model_path={str(model_path)!r} is not a directory")
    if not any(next(path.glob(pattern), None) for pattern in SGLANG_WEIGHTS):
        raise EngineError(f"{name}: engine.model_path={str(model_path)!r} holds no model weights "
                          f"({', '.join(SGLANG_WEIGHTS)}): point it at a Hugging Face model directory")


def start_engine(engine_cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0, index: int = 0,
                 port: int | None = None, log_path: str | Path | None = None, name: str = "engine",
                 config_dir: str | Path | None = None, devices: str | None = None) -> EngineHandle:
    """Start engine ``index`` of the kind ``engine.kind`` names; ``name`` (e.g. ``cell2``) heads any error. A local
    engine's config goes to ``config_dir`` (default: a scratch directory its handle removes); SGLang's holds the
    job secret, so it goes to a private scratch directory the handle removes, made in ``config_dir`` when given
    (a live run's cell directory: a rank killed while its server starts leaves it beside the run's own secret
    file, not in the machine's temporary directory). ``devices``: the replica's ``CUDA_VISIBLE_DEVICES``
    (``replicas.ReplicaSpec.visible_devices``); SGLang runs ``--tp-size engine.tp`` over them."""
    if engine_cfg.kind == "local":
        return start_local_engine(engine_cfg, model_cfg, seed, index, port, log_path, config_dir, name=name,
                                  devices=devices)
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(f"{name}: engine.kind=sglang but the sglang package is not installed "
                          "(bash scripts/setup.sh --sglang)")
    if engine_cfg.model_path is not None:
        require_weights(engine_cfg.model_path, f"{name} (sglang)")
    port = port if port is not None else engine_cfg.port_base + index
    url = f"http://{engine_cfg.host}:{port}"
    device = sglang_device(engine_cfg)
    require_port_free(engine_cfg.host, port, f"{name} (sglang on {device})")
    scratch = scratch_dir("sglang", config_dir)
    secret_config = sglang_secret_config(scratch, port)
    # its ipc sockets stay on a local disk: a run directory may be on a shared file system
    env = sglang_env(device, engine_cfg.tp) | (sglang_tmpdir(scratch) if config_dir is None else {}) | device_env(devices)
    return _spawn(sglang_command(engine_cfg, port, device, secret_config), url, Path(log_path) if log_path else None,
                  engine_cfg.startup_timeout_s, f"{name} (sglang on {device})", env, scratch)
