"""Records of `bench run --slurm` carry provenance.slurm {node, job_id}: `bench compare` says when A and B ran on
different nodes and, with --by-node, compares only cells measured on the same node; `bench report --by-node` adds a
table per node. (The records themselves come from the real Slurm cluster in test_slurm_campaign.py.)"""

from __future__ import annotations

import json

from gpudoctor.bench.records import compare as cmp
from tests.bench.conftest import run_cli
from tests.bench.test_compare import synthetic


def on_nodes(d, nodes):
    """The directory's records, trial k measured on nodes[k]."""
    recs = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines()]
    for r, n in zip(recs, nodes):
        r["provenance"]["slurm"] = {"node": n, "job_id": str(100 + r["trial"])}
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def test_compare_says_when_a_and_b_ran_on_different_nodes(tmp_path):
    a = on_nodes(synthetic(tmp_path, "a", "580.159.04", 1.0), ["n1"])
    b = on_nodes(synthetic(tmp_path, "b", "580.159.04", 1.0), ["n2"])
    res = cmp.compare(cmp.load_side(str(a)), cmp.load_side(str(b)))
    assert res["warnings"] == ["A and B ran on different nodes: n1 vs n2 (a difference may be the nodes'; --by-node "
                               "compares only cells measured on the same node)"]
    p = run_cli("bench", "compare", str(a), str(b))
    assert p.returncode == 0 and "A and B ran on different nodes: n1 vs n2" in p.stdout, p.stdout + p.stderr


def test_by_node_matches_cells_on_their_node(tmp_path):
    a = on_nodes(synthetic(tmp_path, "a", "x", 1.0, trials=4), ["n1", "n1", "n2", "n2"])
    b = on_nodes(synthetic(tmp_path, "b", "x", 1.0, trials=2), ["n1", "n1"])
    res = cmp.compare(cmp.load_side(str(a)), cmp.load_side(str(b)), by_node=True)
    assert [c["cell"]["node"] for c in res["cells"]] == ["n1"] and res["matched_on"][-1] == "node"
    assert [c["node"] for c in res["only_a"]] == ["n2"] and res["only_b"] == []
    assert res["warnings"] == []  # what differs is matched on, not warned about
    assert cmp.compare(cmp.load_side(str(a) + ":node=n2"), cmp.load_side(str(b)))["warnings"][0].startswith(
        "A and B ran on different nodes: n2 vs n1")
    p = run_cli("bench", "compare", str(a), str(b), "--by-node", "--json")
    assert p.returncode == 0, p.stderr
    assert [c["cell"]["node"] for c in json.loads(p.stdout)["cells"]] == ["n1"]


def test_report_by_node(tmp_path):
    a = on_nodes(synthetic(tmp_path, "a", "x", 1.0, trials=3), ["n1", "n1", "n3"])
    p = run_cli("bench", "report", str(a), "--no-plots", "--by-node")
    assert p.returncode == 0, p.stderr
    text = (a / "report.md").read_text()
    section = text[text.index("## By node"):]
    rows = [x for x in section.splitlines() if x.startswith("| n") and not x.startswith("| node")]
    assert [r.split(" | ")[0] for r in rows] == ["| n1", "| n3"] and " 2/2 " in rows[0] and " 1/1 " in rows[1]
    p = run_cli("bench", "report", str(a), "--no-plots")
    assert "## By node" not in (a / "report.md").read_text()
