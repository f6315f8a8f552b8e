"""The credit table (`node.web.credit.credit_view`): ranked by credit, names and teams
from the peers' ads, this node's rank, owners that only spent left out."""

from __future__ import annotations

from node.web.credit import VIEW, credit_view


def _c(earned: float, units: int, conflicts: int = 0, spent: float = 0.0) -> dict:
    return {"earned": earned, "spent": spent, "receipts": units, "units": units,
            "conflicts": conflicts}  # fmt: skip


def test_rows_are_ranked_by_credit_with_names_teams_and_this_nodes_rank() -> None:
    credit = {
        "12D3KooWowner": _c(0.0, 0, spent=9.0),  # spent only: not listed
        "12D3KooWada": _c(5.0, 2),
        "12D3KooWme": _c(3.0, 1),
        "12D3KooWbob": _c(0.0, 0, conflicts=1),  # its only unit is in conflict
    }
    peers = [{"peer_id": "12D3KooWada", "name": "Ada", "team": "Engines"}]
    own = {"peer_id": "12D3KooWme", "name": "", "team": "Engines"}
    view = credit_view(credit, {"12D3KooWada": 4.5}, peers, own)
    assert view["view"] == VIEW and "not a global truth" in VIEW
    assert [(r["rank"], r["peer_id"]) for r in view["peers"]] == [
        (1, "12D3KooWada"), (2, "12D3KooWme"), (3, "12D3KooWbob"),
    ]  # fmt: skip
    ada, me, bob = view["peers"]
    assert (ada["name"], ada["team"], ada["rac"], ada["units"]) == ("Ada", "Engines", 4.5, 2)
    assert me["self"] and me["team"] == "Engines" and view["rank"] == 2
    assert bob["conflicts"] == 1 and bob["name"] == ""  # no ad of it here
    assert credit_view({}, {}, [], own) == {"view": VIEW, "rank": None, "peers": []}
