"""The volunteer's preferences: when this node may train, beyond the advertised policy.

BOINC's users keep a client for years because it trains when they are away and not
when they are not. Here: time-of-day windows (`hours`), only after the machine has
been idle for `idle_minutes`, at most `daily_gpu_hours` a day, on chosen `gpus`; and
the machine guards (`max_cpu_temp_c`, `max_gpu_temp_c`, `pause_on_battery`,
`exclusive_apps`, `min_free_memory_gb`: `node.work.run.guards`).
Each is a setting (`node.settings`), where its type, default and range are declared;
what the windows, GPUs and peer ids must look like is checked here, for the config
file, the CLI and the API alike; what they mean for a running unit is
`node.work.run.availability`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from protocol import Policy, ProtocolError
from protocol.capacity import GpuInfo
from protocol.peer_id import public_key_from_peer_id

#: "HH:MM-HH:MM", a window that may wrap past midnight ("22:00-07:00")
_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
MAX_WINDOWS = 24
MAX_GPUS = 64
MAX_APPS = 32
_APP = re.compile(r"^[A-Za-z0-9._+-]{1,64}$")  # an executable's file name, no path


class PreferenceError(ValueError):
    """A preference value is invalid; the message names the key and an example."""


@dataclass(frozen=True)
class Window:
    """Minutes of the day [start, end); end < start wraps past midnight, and
    start == end is the whole day."""

    start: int
    end: int

    def contains(self, minute: int) -> bool:
        if self.start == self.end:
            return True
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end

    def minutes_until_open(self, minute: int) -> int:
        return (self.start - minute) % (24 * 60)


def parse_hours(text: str) -> tuple[Window, ...]:
    """ "22:00-07:00" or "12:00-13:30, 22:00-07:00" (local time); "" is any time."""
    if not text.strip():
        return ()
    parts = text.split(",")
    if len(parts) > MAX_WINDOWS:
        raise PreferenceError(f"hours: at most {MAX_WINDOWS} windows, got {len(parts)}")
    windows = []
    for part in parts:
        match = _WINDOW.match(part)
        if match is None:
            raise PreferenceError(
                f'hours: {part.strip()!r} is not a window like "22:00-07:00" (24-hour '
                'local time; several are separated by commas; "" is any time)'
            )
        h1, m1, h2, m2 = (int(g) for g in match.groups())
        for hour, minute in ((h1, m1), (h2, m2)):
            if hour > 24 or minute > 59 or (hour == 24 and minute):
                raise PreferenceError(f"hours: {part.strip()!r} has a time past 24:00")
        windows.append(Window((h1 * 60 + m1) % 1440, (h2 * 60 + m2) % 1440))
    return tuple(windows)


@dataclass(frozen=True)
class Preferences:
    """When this node trains. Not advertised: peers see only whether it trains now
    (the ad's `paused`)."""

    hours: str = ""  # time-of-day windows, local time; "" = any time
    idle_minutes: float = 0.0  # train only after this long without input; 0 = always
    idle_load_pct: int = 25  # where input cannot be read: "idle" is others' CPU below this
    daily_gpu_hours: float = 0.0  # hours of training a day (GPU-hours on a GPU node); 0 = no cap
    gpus: list[int] = field(default_factory=list)  # CUDA device indexes to use; [] = all
    allow_owners: list[str] = field(default_factory=list)  # if any: take work only from these
    deny_owners: list[str] = field(default_factory=list)  # never take work from these
    # machine guards (node.work.run.guards): 0 or [] = off
    max_cpu_temp_c: float = 0.0  # pause at this CPU temperature
    max_gpu_temp_c: float = 0.0  # pause at this temperature of a GPU in use
    max_gpu_pct: int = 100  # a unit on a GPU trains at most this share of the time
    pause_on_battery: bool = True  # pause while the machine runs on battery
    exclusive_apps: list[str] = field(default_factory=list)  # pause while one of these runs
    min_free_memory_gb: float = 0.0  # pause while other programs are left less than this
    max_units_disk_gb: float = 0.0  # decline offers past this much in all units' folders
    min_free_disk_gb: float = 0.0  # decline offers that would leave less disk free
    max_upload_mbit_s: float = 0.0  # blob transfers out, all together
    max_download_mbit_s: float = 0.0  # blob transfers in, all together
    daily_transfer_gb: float = 0.0  # job data moved a day, both ways: then no more work

    def check(self) -> None:
        """Raise `PreferenceError` naming the first bad key. What a value of each key
        must be (its type, its range) is declared with the setting (`node.settings`) and
        checked there; here: what the hours, GPUs and peer ids must look like."""
        parse_hours(self.hours)
        if len(self.exclusive_apps) > MAX_APPS:
            raise PreferenceError(f"exclusive_apps: at most {MAX_APPS} programs")
        for app in self.exclusive_apps:
            if not _APP.match(app):
                raise PreferenceError(
                    f"exclusive_apps: {app[:80]!r} is not a program's file name, like "
                    '"steam" or "zoom" (letters, digits, . _ + -; at most 64)'
                )
        if len(set(self.gpus)) != len(self.gpus):
            raise PreferenceError("gpus lists a device twice")
        for key in ("allow_owners", "deny_owners"):
            for peer in getattr(self, key):
                try:
                    public_key_from_peer_id(peer)
                except Exception:
                    raise PreferenceError(
                        f"{key}: {peer[:80]!r} is not a peer id (12D3KooW...)"
                    ) from None

    @property
    def windows(self) -> tuple[Window, ...]:
        return parse_hours(self.hours)


POLICY_KEYS = tuple(f.name for f in fields(Policy))
PREFERENCE_KEYS = tuple(f.name for f in fields(Preferences))


def apply_changes(
    policy: Policy, preferences: Preferences, changes: dict[str, Any]
) -> tuple[Policy, Preferences]:
    """`changes`, of the settings' types (`node.settings.api_changes` converts and
    checks what the API receives), applied to both; raises `PreferenceError` naming the
    first bad key and leaves both untouched."""
    unknown = set(changes) - set(POLICY_KEYS) - set(PREFERENCE_KEYS)
    if unknown:
        raise PreferenceError(f"unknown preference {sorted(unknown)[0]!r}")
    new_policy = replace(policy, **{k: v for k, v in changes.items() if k in POLICY_KEYS})
    new_preferences = replace(
        preferences, **{k: v for k, v in changes.items() if k in PREFERENCE_KEYS}
    )
    try:
        new_policy.check("policy")
    except ProtocolError as exc:
        raise PreferenceError(str(exc).removeprefix("policy.")) from exc
    new_preferences.check()
    return new_policy, new_preferences


def chosen_gpus(gpus: list[GpuInfo], chosen: list[int]) -> list[GpuInfo]:
    """The CUDA devices of `gpus` at the indexes in `chosen` (all when none are);
    a CPU-only list stays as it is."""
    cuda = [g for g in gpus if g.kind == "cuda"]
    if not chosen or not cuda:
        return gpus
    return [g for index, g in enumerate(cuda) if index in chosen]


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """ "hours to '22:00-07:00', load_limit_pct to 50" for the node's timeline."""
    return ", ".join(f"{key} to {new[key]!r}" for key in new if new[key] != old.get(key))
