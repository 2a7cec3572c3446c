"""A rank behind a partition (every packet to it dropped) prints its own report, without --all-ranks.

Two hosts made of network namespaces; hostb's link drops everything. Rank 1 on hostb can never
hand its part to rank 0 on hosta, so it prints its own complete report (the dropped connects named
as a firewall); rank 0 prints its own, naming rank 1 as missing.
"""

from __future__ import annotations

import pytest

from host_worlds import RankSpec, distdoctor_world, findings, scenario_deadline
from tests.conftest import deadline_bound

pytestmark = pytest.mark.hosts


def test_a_rank_behind_a_partition_prints_its_own_report(lab):
    lab.partition("hostb")
    run = distdoctor_world(lab, [RankSpec("hosta", 0), RankSpec("hostb", 1)], timeout=scenario_deadline())
    for rank in (0, 1):
        elapsed = run.elapsed_in_distdoctor(rank)
        assert elapsed is not None and elapsed <= deadline_bound(run.timeout), run.describe()
        assert "Traceback" not in run.output(rank), run.describe()
    on_b = run.report(1)  # exactly one JSON object on rank 1's stdout
    assert on_b["world"]["ranks_reported"] == [1], on_b["world"]
    assert findings(on_b, "firewall"), run.describe()
    assert [c for c in on_b["checks"] if c["stage"] == "local"], on_b["checks"]
    assert run.code(1) == 1, run.describe()
    assert 1 in run.report(0)["world"]["ranks_missing"], run.describe()
