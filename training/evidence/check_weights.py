"""`python -m training.evidence.check_weights PATH`: are all values in a weights file finite?

`python -m training.evidence.check_weights --delta PATH NUMEL JOB_ID ROUND BASE_SHA256
COMPRESSION`: is an elastic delta file what the owner expects
(`protocol.rounds.decode_round_delta`)?

Run by the owner in a subprocess of its own (forked by its runner fork server when
one runs, `main`), so that reading a peer's tensor bytes happens outside the daemon,
under an address-space limit. Prints `ok`, or one line
naming the first problem, and exits 1.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

SLACK_BYTES = 1 << 30  # the interpreter, numpy and safetensors themselves


def first_problem(path: Path) -> str | None:
    import numpy as np
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        for name in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
            values = f.get_tensor(name)
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                return f"tensor {name!r} holds NaN or Inf values"
    return None


def delta_problem(
    path: Path, numel: int, job_id: str, round_: int, base: str, compression: str
) -> str | None:
    from protocol.errors import ProtocolError
    from protocol.rounds import decode_round_delta

    try:
        decode_round_delta(
            path.read_bytes(),
            numel=numel,
            job_id=job_id,
            round=round_,
            base_sha256=base,
            compression=compression,
        )
    except ProtocolError as exc:
        return f"not this round's delta: {exc}"
    return None


def main(args: list[str] | None = None) -> int:
    """Check the file `args` (default: the command line's) names; print `ok` or the
    problem. Run in a fresh interpreter or forked by a runner fork server
    (`training.run.forkserver`), whose address space already holds torch: the limit
    is on top of what is mapped now."""
    args = sys.argv[1:] if args is None else args
    try:
        problem = _problem(args)
    except Exception as exc:
        problem = f"not a readable file ({type(exc).__name__}: {exc})"
    print(problem or "ok")
    return 1 if problem else 0


def _problem(args: list[str]) -> str | None:
    delta = args[:1] == ["--delta"]
    if len(args) != (7 if delta else 1):
        return f"bad arguments: expected PATH or --delta and 6 more, got {len(args)}"
    path = Path(args[1] if delta else args[0])
    if delta and not (args[2].isdigit() and args[4].isdigit()):
        return f"bad arguments: NUMEL and ROUND must be integers, got {args[2]!r}, {args[4]!r}"
    limit = _mapped_bytes() + 3 * path.stat().st_size + SLACK_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if delta:
        _, _, numel, job_id, round_, base, compression = args
        return delta_problem(path, int(numel), job_id, int(round_), base, compression)
    return first_problem(path)


def _mapped_bytes() -> int:
    """This process's address space now (`/proc/self/statm`'s first field)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * resource.getpagesize()


if __name__ == "__main__":
    sys.exit(main())
