"""Networking: the libp2p host wrapper, capacity gossip, the peer table, discovery,
and the one bridge between trio (libp2p) and asyncio (aiohttp)."""
