"""An eager share's round weights, taken on its way (`training.elastic.starts`).

A share that starts eagerly trains from a guess of its round's global weights; after
`ElasticSpec.takes_weights_at` steps its runner waits for the real ones and moves
to them. The owner names them in its answer to a heartbeat once the round before
closed (`ProgressAck.weights_sha256`), with the update that gives them from the
weights the share started from (held here) and a grant to fetch that one blob. This
fetches it and tells the runner where it is: a JSON notice beside the runner's
output, written whole or not at all (the runner polls for it). The runner rebuilds
the weights and checks their hash; this node keeps them as the job's newest.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from node.work.blobs import fetch_granted
from node.work.context import WorkContext
from node.work.run import TAKES_NOTICE
from protocol import open_envelope
from protocol.blobs import BlobGrant
from protocol.rounds import RoundShare
from protocol.work import WORK_LIMITS, ProgressAck, WorkPackage
from training.spec.job import elastic_of_plain, relay_blob_bytes

TAKES_BLOB = "takes.blob"  # the update (or weights) the notice names, beside it
# what the owner may ask this node to fetch: about the weights it holds, and a margin
SIZE_MARGIN = 64 * 1024


def takes_weights(spec: dict[str, Any], share: RoundShare | None) -> bool:
    """Whether this share takes its round's weights on its way."""
    return (
        share is not None
        and bool(share.start_delta_sha256)
        and elastic_of_plain(spec).takes_weights
    )


async def fetch_taken(
    ctx: WorkContext,
    owner: str,
    package: WorkPackage,
    spec: dict[str, Any],
    ack: ProgressAck,
    folder: Path,
) -> str:
    """Fetch the blob `ack` names under its grant, then write the runner's notice in
    `folder`; returns the blob's sha256. Raises on a grant that is not for this
    share and this node, or a fetch that fails (the next heartbeat's answer says it
    again)."""
    share = package.round_share
    assert share is not None
    blob = ack.update_sha256 or ack.weights_sha256
    grant = open_envelope(
        ack.weights_grant, BlobGrant, expected_signer=owner, limits=WORK_LIMITS
    ).message
    if (
        grant.grantee != ctx.peer_id
        or (grant.job_id, grant.unit_id) != (package.job_id, package.unit_id)
        or list(grant.blobs) != [blob]
    ):
        raise ValueError("the grant to the round's weights is not for this share")
    bound = ctx.blobs.size(share.weights_sha256) + SIZE_MARGIN
    await fetch_granted(
        ctx,
        owner,
        grant,
        ack.weights_grant,
        package.job_key,
        [blob],
        min(grant.max_bytes, bound),
        relay_blob_bytes(spec),
    )
    path = folder / TAKES_BLOB  # the runner reads nothing of this node's outside its folder
    path.unlink(missing_ok=True)
    try:
        os.link(ctx.blobs.path(blob), path)
    except OSError:  # another file system
        shutil.copyfile(ctx.blobs.path(blob), path)
    told = {"weights_sha256": ack.weights_sha256}
    told |= {"update": str(path)} if ack.update_sha256 else {"weights": str(path)}
    part = folder / (TAKES_NOTICE + ".part")
    part.write_text(json.dumps(told))
    os.replace(part, folder / TAKES_NOTICE)
    return blob
