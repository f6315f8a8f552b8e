"""The volunteer's preferences: when this node may train, beyond the advertised policy.

BOINC's users keep a client for years because it trains when they are away and not
when they are not. Here: time-of-day windows (`hours`), only after the machine has
been idle for `idle_minutes`, at most `daily_gpu_hours` a day, on chosen `gpus`.
Values are checked here, once, for the config file, the CLI and the API alike; what
they mean for a running unit is `node.work.run.availability`.
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

    def check(self) -> None:
        """Raise `PreferenceError` naming the first bad key."""
        parse_hours(self.hours)
        if not 0 <= self.idle_minutes <= 24 * 60:
            raise PreferenceError("idle_minutes must be 0..1440 (0: train whenever allowed)")
        if not 0 <= self.idle_load_pct <= 100:
            raise PreferenceError("idle_load_pct must be 0..100")
        if not 0 <= self.daily_gpu_hours <= 24:
            raise PreferenceError("daily_gpu_hours must be 0..24 (0: no daily cap)")
        if len(self.gpus) > MAX_GPUS or any(not 0 <= g < MAX_GPUS for g in self.gpus):
            raise PreferenceError(f"gpus must be device indexes 0..{MAX_GPUS - 1}, like [0, 1]")
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
_LISTS = {"gpus": int, "allow_owners": str, "deny_owners": str}


def apply_changes(
    policy: Policy, preferences: Preferences, changes: dict[str, Any]
) -> tuple[Policy, Preferences]:
    """`changes` (JSON from the API or the page) applied to both; raises
    `PreferenceError` naming the first bad key and leaves both untouched."""
    unknown = set(changes) - set(POLICY_KEYS) - set(PREFERENCE_KEYS)
    if unknown:
        known = ", ".join((*POLICY_KEYS, *PREFERENCE_KEYS))
        raise PreferenceError(f"unknown preference {sorted(unknown)[0]!r}; known: {known}")
    typed = {key: _typed(key, value, _current(policy, preferences, key))
             for key, value in changes.items()}  # fmt: skip
    new_policy = replace(policy, **{k: v for k, v in typed.items() if k in POLICY_KEYS})
    new_preferences = replace(
        preferences, **{k: v for k, v in typed.items() if k in PREFERENCE_KEYS}
    )
    try:
        new_policy.check("policy")
    except ProtocolError as exc:
        raise PreferenceError(str(exc).removeprefix("policy.")) from exc
    new_preferences.check()
    return new_policy, new_preferences


def _current(policy: Policy, preferences: Preferences, key: str) -> Any:
    return getattr(policy if key in POLICY_KEYS else preferences, key)


def _typed(key: str, value: Any, current: Any) -> Any:
    if key in _LISTS:
        kind = _LISTS[key]
        if isinstance(value, str):  # the page's text field: "0, 1" or one id a line
            value = [v for v in re.split(r"[\s,]+", value) if v]
            if kind is int and not all(v.isdigit() for v in value):
                raise PreferenceError(f"{key} must be device indexes like 0, 1")
            value = [kind(v) for v in value]
        if not isinstance(value, list) or not all(
            isinstance(v, kind) and not isinstance(v, bool) for v in value
        ):
            raise PreferenceError(f"{key} must be a list of {kind.__name__}s")
        return list(value)
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise PreferenceError(f"{key} must be true or false")
        return value
    if isinstance(current, str):
        if not isinstance(value, str) or len(value) > 1000:
            raise PreferenceError(f"{key} must be text")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PreferenceError(f"{key} must be a number")
    if isinstance(current, int) and value != int(value):
        raise PreferenceError(f"{key} must be a whole number")
    return type(current)(value)


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
