"""A multipart/form-data request body (RFC 7578), how a job and its files are uploaded.

Files are read in chunks while the body is sent, so a large data file is never held in
memory; the size is known beforehand, for the Content-Length the node's upload cap reads.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

CHUNK_BYTES = 1 << 20


class Form:
    def __init__(self) -> None:
        self.boundary = f"meshminer-{secrets.token_hex(16)}"
        self._parts: list[tuple[bytes, bytes | Path]] = []  # (head, content or file)

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def add_text(self, name: str, text: str) -> None:
        head = self._head(name, None, "text/plain; charset=utf-8")
        self._parts.append((head, text.encode()))

    def add_file(self, name: str, path: Path, filename: str) -> None:
        """Send the file at `path` as field `name`, named `filename` (the node sees no path)."""
        self._parts.append((self._head(name, filename, "application/octet-stream"), path))

    @property
    def size(self) -> int:
        body = sum(
            len(head) + (len(c) if isinstance(c, bytes) else c.stat().st_size) + 2
            for head, c in self._parts
        )
        return body + len(self._closing)

    def chunks(self) -> Iterator[bytes]:
        for head, content in self._parts:
            yield head
            if isinstance(content, bytes):
                yield content
            else:
                with open(content, "rb") as f:
                    while chunk := f.read(CHUNK_BYTES):
                        yield chunk
            yield b"\r\n"
        yield self._closing

    @property
    def _closing(self) -> bytes:
        return f"--{self.boundary}--\r\n".encode()

    def _head(self, name: str, filename: str | None, content_type: str) -> bytes:
        disposition = f'form-data; name="{_escaped(name)}"'
        if filename is not None:
            disposition += f'; filename="{_escaped(filename)}"'
        return (
            f"--{self.boundary}\r\nContent-Disposition: {disposition}\r\n"
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode()


def _escaped(value: str) -> str:
    """A name or file name inside a quoted header parameter, as browsers escape them."""
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
