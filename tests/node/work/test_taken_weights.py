"""The worker's end of an eager share taking its round's weights: the owner's answer
names a blob and a grant to it; a grant that is not the owner's, or not for this
share, this node and that one blob, is refused before anything is fetched, and the
runner is told nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.work.blobs import issue_grant
from node.work.context import WorkContext
from node.work.run import TAKES_NOTICE
from node.work.taken_weights import fetch_taken, takes_weights
from protocol import ProtocolError
from protocol.rounds import RoundShare
from protocol.work import ProgressAck, WorkPackage
from tests.contexts import offline_context

JOB, UNIT = "ab" * 8, "cd" * 8
UPDATE, WEIGHTS = "1" * 64, "2" * 64
SPEC = {"elastic": {"inner_steps": 20}}  # overlap left out: its default, 0.25


@pytest.fixture
def parties(tmp_path: Path) -> tuple[WorkContext, WorkContext, WorkContext]:
    """The share's owner, its worker, and a stranger to both."""
    for name in ("owner", "worker", "stranger"):
        (tmp_path / name).mkdir()
    return tuple(offline_context(tmp_path / name) for name in ("owner", "worker", "stranger"))


def _package(share: RoundShare | None = None) -> WorkPackage:
    share = share or RoundShare(2, 0, "3" * 64, start_delta_sha256="4" * 64)
    return WorkPackage(JOB, UNIT, b"", [], b"", b"k" * 32, 1.0, 30.0, share)


def test_only_an_eager_share_of_a_job_that_overlaps_takes_weights() -> None:
    eager = RoundShare(2, 0, "3" * 64, start_delta_sha256="4" * 64)
    assert takes_weights(SPEC, eager)
    assert not takes_weights(SPEC, RoundShare(2, 0, "3" * 64))  # started from them
    assert not takes_weights({"elastic": {"inner_steps": 20, "overlap": 1}}, eager)
    assert not takes_weights({"elastic": {"inner_steps": 20, "overlap": 0}}, eager)
    assert not takes_weights(SPEC, None)


@pytest.mark.parametrize(
    ("grant", "error"),
    [
        ({"unit_id": "ef" * 8}, ValueError),
        ({"job_id": "ef" * 8}, ValueError),
        ({"blobs": [WEIGHTS]}, ValueError),
        ({"blobs": [UPDATE, WEIGHTS]}, ValueError),
        ({"grantee": "stranger"}, ValueError),
        ({"signer": "stranger"}, ProtocolError),
    ],
)
def test_a_grant_not_for_this_share_and_blob_is_refused_before_any_fetch(
    parties: tuple[WorkContext, WorkContext, WorkContext],
    tmp_path: Path,
    grant: dict,
    error: type[Exception],
) -> None:
    owner, worker, stranger = parties
    fields = {"job_id": JOB, "unit_id": UNIT, "grantee": worker.peer_id, "blobs": [UPDATE]}
    fields |= {k: stranger.peer_id if v == "stranger" else v for k, v in grant.items()}
    fields.pop("signer", None)
    signer = stranger if "signer" in grant else owner
    sealed = issue_grant(signer, max_bytes=1 << 20, valid_s=60, **fields)
    ack = ProgressAck(True, weights_sha256=WEIGHTS, update_sha256=UPDATE, weights_grant=sealed)
    folder = tmp_path / "unit"
    folder.mkdir()

    async def main() -> None:
        await fetch_taken(worker, owner.peer_id, _package(), SPEC, ack, folder)

    with pytest.raises(error):
        trio.run(main)
    assert list(folder.iterdir()) == []  # no notice, no blob
    assert not (folder / TAKES_NOTICE).exists()
