"""Every HTTP client of a process shares one TLS context (gyre_hpc/net/tls.py), built once, verifying as httpx's default."""
import ssl

from gyre_hpc.net import tls
from gyre_hpc.engines.client import AsyncEngineClient, EngineClient
from gyre_hpc.proxy.client import ProxyClient


def test_a_process_builds_its_tls_context_once_however_many_clients_it_makes(monkeypatch):
    built = []
    real = ssl.create_default_context

    def counting(*args, **kwargs):
        built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    tls.context.cache_clear()
    clients = [EngineClient("http://127.0.0.1:1", token="t") for _ in range(3)]
    clients += [ProxyClient("http://127.0.0.1:1", token="t") for _ in range(2)]
    async_clients = [AsyncEngineClient("http://127.0.0.1:1", token="t") for _ in range(3)]
    assert len(built) == 1
    assert tls.context() is tls.context()
    for c in clients:
        c.close()
    del async_clients


def test_the_shared_context_verifies_certificates_and_host_names_as_httpx_does_by_default():
    tls.context.cache_clear()
    ctx = tls.context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
