"""Config guards of the exposure rules (docs/reliability.md): HTTP limits and verified Mooncake pulls."""
from __future__ import annotations

import pytest

from gyre_hpc.config import GyreConfig, load_config
from gyre_hpc.errors import ConfigError


def test_http_limits_are_per_listener_and_default_to_finite_values():
    cfg = GyreConfig()
    for http in (cfg.proxy.http, cfg.engine.http):
        assert http.max_body_bytes > 0 and http.header_timeout_s > 0 and http.body_timeout_s > 0
        assert http.max_json_depth >= 8 and 1 <= http.max_connections_per_client <= http.max_connections


@pytest.mark.parametrize("override,key", [
    ("proxy.http.max_body_bytes=0", "proxy.http.max_body_bytes"),
    ("engine.http.header_timeout_s=0", "engine.http.header_timeout_s"),
    ("proxy.http.max_json_depth=-1", "proxy.http.max_json_depth"),
    ("proxy.http.slowloris=1", "proxy.http.slowloris"),
])
def test_a_bad_http_limit_names_its_dotted_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_mooncake_pulls_cannot_skip_their_checksums():
    with pytest.raises(ConfigError, match=r"transfer\.verify: must stay true with backend mooncake"):
        load_config(None, ["transfer.verify=false"])
    assert load_config(None, ["transfer.verify=false", "transfer.backend=socket"]).transfer.verify is False
