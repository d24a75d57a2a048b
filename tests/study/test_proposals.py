"""The proposal queue: ids in order, oldest first, each taken once."""

from __future__ import annotations

from pathlib import Path

from infrarsi.study.proposals import Proposal, ProposalQueue


def _p(q: ProposalQueue, why: str) -> Proposal:
    return q.add(Proposal(proposal_id=q.next_id(), config={"zero_stage": 1}, why=why))


def test_proposals_queue_in_order_and_each_is_taken_once(tmp_path: Path) -> None:
    q = ProposalQueue(tmp_path)
    assert q.queued() == [] and q.take() is None and q.next_id() == "prop-0001"
    a, b = _p(q, "first"), _p(q, "second")
    assert (a.proposal_id, b.proposal_id) == ("prop-0001", "prop-0002") and a.created_at > 0
    other = ProposalQueue(tmp_path)  # another process's view of the same study
    taken = q.take()
    assert taken is not None and taken.why == "first"
    again = other.take()
    assert again is not None and again.why == "second"
    assert q.take() is None and other.take() is None
    assert [p.proposal_id for p in q.taken()] == ["prop-0001", "prop-0002"]
    assert q.next_id() == "prop-0003"  # taken ids are never reused


def test_a_proposal_round_trips_through_its_dict() -> None:
    p = Proposal(
        proposal_id="prop-0001",
        config={"a": 1},
        why="w",
        proposer="mcp",
        asked={"a": 1},
        patch="proposals/patches/prop-0001.diff",
        patch_paths=["workloads/x.py"],
        created_at=1.0,
    )
    assert Proposal.from_dict({**p.to_dict(), "from_a_later_version": 1}) == p
