"""Node settings: embedded defaults < `meshminer.toml` in the data dir <
`preferences.json` (what the page, the API or `node prefs` changed) < CLI flags.

The settings themselves are declared once, in `node.settings.declarations`; this
module reads them from the file and layers them. A config file with an unknown key or
a value of the wrong type stops the node with an error naming the key, because a
silently ignored typo in a volunteer's policy is worse than a node that does not
start.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from node.settings.declarations import API_KEYS, BY_NAME, SETTINGS, Settings
from node.settings.schema import ConfigError, from_toml

__all__ = [
    "CONFIG_FILE",
    "ConfigError",
    "Settings",
    "data_dir_from",
    "load_saved_preferences",
    "load_settings",
    "parse_config",
    "save_preferences",
    "settings_reference",
]

CONFIG_FILE = "meshminer.toml"
SAVED_PREFERENCES = "preferences.json"  # changes from the page, API or `node prefs`
DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "meshminer"
SETTINGS_DOC = "docs/settings.md"
#: the TOML tables settings go in ("" is the top level)
TABLES = tuple(dict.fromkeys(s.section for s in SETTINGS if s.section))


def parse_config(text: str, source: str = CONFIG_FILE) -> dict[str, Any]:
    """Parse TOML text into validated overrides (key -> value)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    overrides: dict[str, Any] = {}

    def take(section: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            name = f"{section}.{key}" if section else key
            s = BY_NAME.get(key)
            if isinstance(value, dict) and not section and key in TABLES:
                take(key, value)
                continue
            if s is not None and s.section != section:
                where = f"the [{s.section}] table" if s.section else "the top level"
                raise ConfigError(f"setting '{name}' in {source} belongs in {where}")
            if s is None:
                raise ConfigError(
                    f"unknown setting '{name}' in {source}; "
                    f"the settings are listed in {SETTINGS_DOC}"
                )
            overrides[key] = from_toml(name, s.type, value)

    take("", raw)
    return overrides


def data_dir_from(cli_value: Path | None) -> Path:
    """--data-dir, else $MESHMINER_DATA_DIR, else ~/.local/share/meshminer."""
    if cli_value is not None:
        return cli_value.expanduser()
    env = os.environ.get("MESHMINER_DATA_DIR")
    return Path(env).expanduser() if env else DEFAULT_DATA_DIR


def load_settings(data_dir: Path, cli_overrides: dict[str, Any] | None = None) -> Settings:
    """Defaults, then `meshminer.toml` in `data_dir` (if any), then the preferences
    saved from the page or the API (`preferences.json`), then CLI flags."""
    settings = Settings()
    path = data_dir / CONFIG_FILE
    if path.exists():
        settings = replace(settings, **parse_config(path.read_text(), str(path)))
    settings = replace(settings, **load_saved_preferences(data_dir))
    overrides = {k: v for k, v in (cli_overrides or {}).items() if v is not None}
    settings = replace(settings, **overrides)
    settings.check()
    return settings


def load_saved_preferences(data_dir: Path) -> dict[str, Any]:
    """The policy and preferences changed at runtime, as `save_preferences` kept them."""
    path = data_dir / SAVED_PREFERENCES
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); delete it to go on") from None
    if not isinstance(saved, dict) or any(key not in API_KEYS for key in saved):
        raise ConfigError(f"{path} holds something other than policy settings; delete it")
    return {key: from_toml(f"{path.name}: {key}", BY_NAME[key].type, v)
            for key, v in saved.items()}  # fmt: skip


def save_preferences(data_dir: Path, changes: dict[str, Any]) -> None:
    """Keep runtime changes for the next start (mode 0600, replaced atomically)."""
    path = data_dir / SAVED_PREFERENCES
    kept = {**load_saved_preferences(data_dir), **changes}
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(kept, out, indent=1, sort_keys=True)
    os.replace(temporary, path)


def settings_reference() -> list[tuple[str, str, Any, str]]:
    """(TOML key, type, default, description) for every setting, for docs and help."""
    return [(s.key, s.type, s.default, s.description) for s in SETTINGS]
