"""Settings and identity: defaults, TOML overrides, clear errors, 0600 secrets."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from node.identity import (
    KEY_FILE,
    TOKEN_FILE,
    IdentityError,
    load_or_create_api_token,
    load_or_create_identity,
)
from node.settings.config import (
    ConfigError,
    Settings,
    load_settings,
    parse_config,
    settings_reference,
)


def test_defaults_toml_and_flags_layer_in_that_order(tmp_path: Path) -> None:
    (tmp_path / "meshminer.toml").write_text(
        'http = "127.0.0.1:9000"\npublish_interval_s = 5\n[policy]\naccepting = false\n'
    )
    s = load_settings(tmp_path, {"http": "127.0.0.1:9100", "listen": None})
    assert s.http == "127.0.0.1:9100"  # flag beats file
    assert s.publish_interval_s == 5.0  # file beats default (int accepted for float)
    assert s.accepting is False
    assert s.listen == Settings().listen  # None flag = not given
    assert s.ttl_s == 15.0  # 3 x publish interval when peer_ttl_s is 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("listne = '/ip4/1.2.3.4/tcp/1'", "unknown setting 'listne'"),
        ("[policy]\nacepting = true", "unknown setting 'policy.acepting'"),
        ("accepting = true", "setting 'accepting' in meshminer.toml belongs in the [policy]"),
        ("publish_interval_s = 'fast'", "setting 'publish_interval_s' must be float"),
        ("[policy]\nload_limit_pct = 50.5", "setting 'policy.load_limit_pct' must be int"),
        ("bootstrap = '/ip4/1.2.3.4'", "setting 'bootstrap' must be a list of strings"),
        ("mdns = 1", "setting 'mdns' must be bool"),
        ("listen = ", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_config(text)


def test_out_of_range_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="load_limit_pct"):
        load_settings(tmp_path, {"load_limit_pct": 150})
    with pytest.raises(ConfigError, match="'http' must be HOST:PORT"):
        load_settings(tmp_path, {"http": "localhost"})
    with pytest.raises(ConfigError, match="reachability.*auto, public, private"):
        load_settings(tmp_path, {"reachability": "behind-nat"})
    with pytest.raises(ConfigError, match="relay_circuit_mb"):
        load_settings(tmp_path, {"relay_circuit_mb": 0})  # the library would read 0 as none
    with pytest.raises(ConfigError, match="'max_connections' must be 0 or at least target_peers"):
        load_settings(tmp_path, {"target_peers": 8, "max_connections": 4})
    with pytest.raises(ConfigError, match="'connection_idle_s' must be >= 0"):
        load_settings(tmp_path, {"connection_idle_s": -1.0})
    assert list(tmp_path.iterdir()) == []  # nothing written for a refused setting


def test_every_setting_is_documented() -> None:
    rows = settings_reference()
    assert {r[0] for r in rows} >= {"listen", "http", "bootstrap", "policy.accepting"}
    assert all(r[3] for r in rows)


@pytest.mark.process
def test_node_with_bad_config_does_not_start(tmp_path: Path) -> None:
    (tmp_path / "meshminer.toml").write_text("[policy]\nload_limit = 50\n")
    proc = subprocess.run(
        [sys.executable, "-m", "node", "node", "run", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown setting 'policy.load_limit'" in proc.stderr
    assert "did not start" in proc.stderr
    assert not (tmp_path / "node.db").exists()


def test_identity_is_created_0600_and_kept(tmp_path: Path) -> None:
    first = load_or_create_identity(tmp_path)
    mode = stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode)
    assert mode == 0o600
    assert load_or_create_identity(tmp_path).peer_id == first.peer_id
    assert first.peer_id.startswith("12D3KooW")


def test_api_token_is_created_0600_and_kept(tmp_path: Path) -> None:
    token = load_or_create_api_token(tmp_path)
    assert len(token) >= 32
    assert stat.S_IMODE((tmp_path / TOKEN_FILE).stat().st_mode) == 0o600
    assert load_or_create_api_token(tmp_path) == token


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    load_or_create_identity(tmp_path)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_or_create_identity(tmp_path)


def test_truncated_key_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / KEY_FILE
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="32-byte"):
        load_or_create_identity(tmp_path)
    assert path.read_bytes() == b"short"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"listen": "garbage"}, "setting 'listen': 'garbage' is not a multiaddr"),
        ({"listen": "/ip4/127.0.0.1/udp/1"}, "setting 'listen'.*has no tcp part"),
        ({"bootstrap": ["/ip4/127.0.0.1/tcp/1"]}, "setting 'bootstrap'.*has no p2p part"),
    ],
)
def test_bad_addresses_are_refused_before_anything_starts(
    tmp_path: Path, overrides: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(tmp_path, overrides)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.process
def test_second_node_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    from node.store import DataDirInUse, lock_data_dir

    held = lock_data_dir(tmp_path)
    try:
        with pytest.raises(DataDirInUse, match="another meshminer node"):
            lock_data_dir(tmp_path)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "node",
                "node",
                "run",
                "--data-dir",
                str(tmp_path),
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--http",
                "127.0.0.1:0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1
        assert "another meshminer node is running" in proc.stderr
        assert not (tmp_path / "node.db").exists()
    finally:
        held.close()
    lock_data_dir(tmp_path).close()  # free again once the holder is gone


def test_a_bad_preferences_file_stops_the_node_and_stays_as_it_was(tmp_path: Path) -> None:
    from node.settings.config import load_settings, save_preferences

    save_preferences(tmp_path, {"hours": "22:00-07:00", "gpus": [0]})
    assert load_settings(tmp_path).preferences().hours == "22:00-07:00"
    assert load_settings(tmp_path, {"hours": ""}).hours == ""  # a flag wins
    path = tmp_path / "preferences.json"
    for bad, message in [
        ("{not json", "is not readable JSON"),
        ('{"listen": "/ip4/0.0.0.0/tcp/1"}', "holds something other than policy settings"),
        ('{"gpus": "0"}', "must be a list of integers"),
        ('{"hours": "7pm"}', "is not a window like"),
    ]:
        path.write_text(bad)
        with pytest.raises(ConfigError, match=message):
            load_settings(tmp_path)
        assert path.read_text() == bad  # refused, not rewritten
