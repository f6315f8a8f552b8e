"""PACKAGE node.work.owner.

Modules:

    fanout            Offering one job's many units at once (a round's shares, a sweep's
                      trials).
    leases            Leases: a remote unit lives while its worker's heartbeats keep
                      coming, and never past the job's `max_hours`.
    lifecycle         What happens to a job when one of its units starts, ends, fails or
                      is lost.
    placement         Placement: which worker gets a job's next unit, and what a decline
                      means.
    result_files      A result's weights (an elastic share's delta) fetched under the
                      worker's grant and checked against the job's model plan before
                      anything of the result is accepted.
    results           A worker's result: verified, its weights fetched and checked,
                      answered with a receipt.
    role              The owner's side of its jobs: the loop that places units, and the
                      parts it is made of.
    submission        What a submission's uploaded files become before its job exists:
                      the spec rewritten to name blobs, and the files those blobs will
                      be made from.
    worker_choice     Choosing a worker for a job: requirements, the worker's policy,
                      throughput, load.
    modes             (package)
"""

from node.work.owner.leases import Leases
from node.work.owner.lifecycle import MAX_ATTEMPTS, Lifecycle, round_closed_reason
from node.work.owner.placement import BACKOFF_MAX_S, Backoff
from node.work.owner.role import OwnerRole
from node.work.owner.submission import SubmitError, with_uploaded_data, with_uploaded_model
from node.work.owner.worker_choice import SELF, choose_worker

__all__ = [
    "BACKOFF_MAX_S",
    "Backoff",
    "Leases",
    "Lifecycle",
    "MAX_ATTEMPTS",
    "OwnerRole",
    "SELF",
    "SubmitError",
    "choose_worker",
    "round_closed_reason",
    "with_uploaded_data",
    "with_uploaded_model",
]
