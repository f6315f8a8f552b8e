"""The meshminer node daemon: identity, config, libp2p host, peer table, HTTP API, CLI."""

__version__ = "0.1.0"
