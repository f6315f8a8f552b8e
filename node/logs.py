"""Logging: one line per event that matters, to stderr and a rotating file."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# py-libp2p logs a lot at INFO (and some expected errors at WARNING)
_NOISY = ("libp2p", "multiaddr", "zeroconf", "aiohttp.access", "async_service")


def setup_logging(level: str, data_dir: Path) -> Path:
    """Configure the root logger; returns the log file path."""
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / "node.log"
    formatter = logging.Formatter(LOG_FORMAT)
    stderr = logging.StreamHandler()
    file = logging.handlers.RotatingFileHandler(log_file, maxBytes=5 << 20, backupCount=3)
    root = logging.getLogger()
    root.handlers.clear()
    for handler in (stderr, file):
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _NOISY:
        # their failures surface as our own log lines with the reason; at debug, show them
        logging.getLogger(name).setLevel(
            logging.WARNING if root.level <= logging.DEBUG else logging.CRITICAL
        )
    return log_file
