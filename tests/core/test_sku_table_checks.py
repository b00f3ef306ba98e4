"""The SKU table checks itself when it is loaded (gpudoctor/catalog/deep_limits.py): each field in its unit's
plausible range, 0 < floor < healthy <= 1, every number with a source, every assumed floor saying from what — and a
bad entry, shipped or in a site's table (/etc/gpudoctor/gpu_skus.json, $GPUDOCTOR_SKU_TABLE), is one line naming the
file and the entry, exit 3. An assumed floor says so in the finding's own text, not only in the JSON."""

from __future__ import annotations

import copy
import json
import os

import pytest

from gpudoctor.catalog import deep_limits
from gpudoctor.catalog.deep_limits import SITE_ENV, sku_for, table, table_problems
from gpudoctor.errors import ConfigError
from tests.console import gpudoctor

from . import deep_captures as dc
from .conftest import CAPTURES

H100_DEEP = CAPTURES / "h100-2026-12-05" / "h100-deep-healthy.snapshot.json"


def h100(t):
    return next(s for s in t["skus"] if s["sku"] == "H100 SXM")


@pytest.mark.parametrize("edit, words", [
    (lambda t: h100(t).update(memory_gbs=3.35), "H100 SXM: memory_gbs 3.35 is not a memory bandwidth in GB/s"),
    (lambda t: h100(t).update(memory_gbs=3350000), "H100 SXM: memory_gbs 3.35e+06 is not a memory bandwidth in GB/s"),
    (lambda t: h100(t).update(bf16_dense_tflops=1.979), "H100 SXM: bf16_dense_tflops 1.979 is not a dense bf16 peak"),
    (lambda t: h100(t).update(bf16_dense_tflops="989"), "H100 SXM: bf16_dense_tflops \"989\" is not a number"),
    (lambda t: h100(t).update(nvlink_gbs_per_link=900), "H100 SXM: nvlink_gbs_per_link 900 is not an NVLink rate"),
    (lambda t: h100(t)["floors"]["gemm"].update(floor=0.76), "H100 SXM gemm: floor 0.76 at or above its healthy ratio 0.76"),
    (lambda t: h100(t)["floors"]["gemm"].update(floor=0.7, healthy=1.2), "floor 0.7, healthy 1.2: ratios must be 0 < floor < healthy <= 1"),
    (lambda t: h100(t)["floors"]["d2d"].update(floor=0), "H100 SXM d2d: floor 0, healthy 0.87: ratios must be"),
    (lambda t: h100(t)["floors"]["d2d"].update(source="a guess"), 'must start with "measured"'),
    (lambda t: h100(t)["floors"]["d2d"].update(source="assumed from a neighbour"), "needs assumed_from"),
    (lambda t: h100(t).update(match=["^NVIDIA H100 (80GB"]), "H100 SXM: match '^NVIDIA H100 (80GB' is not a regular"),
    (lambda t: t["skus"].append(copy.deepcopy(h100(t))), "H100 SXM: listed twice"),
    (lambda t: h100(t).pop("source"), "H100 SXM: memory and bf16 figures without an NVIDIA source"),
])
def test_an_implausible_entry_is_one_problem_naming_it(edit, words):
    t = copy.deepcopy(table())
    edit(t)
    problems = table_problems(t)
    assert len(problems) == 1 and words in problems[0], problems


def test_the_shipped_table_passes_and_every_sku_has_its_sources():
    assert table_problems() == []
    for s in table()["skus"]:
        assert s["source"] and all(f["source"] for f in s["floors"].values()), s["sku"]


def site_table(tmp_path, entries, mode=0o644) -> str:
    p = tmp_path / "gpu_skus.json"
    p.write_text(json.dumps({"schema": "gpudoctor.gpu_skus/1", "skus": entries}))
    os.chmod(p, mode)
    return str(p)


def test_a_site_entry_replaces_the_shipped_one_and_judges_by_its_floors(tmp_path, monkeypatch):
    mine = copy.deepcopy(sku_for("NVIDIA H100 80GB HBM3"))
    mine["floors"]["gemm"].update(floor=0.8, healthy=0.88)  # a site whose H100s reach 0.88 of peak
    monkeypatch.setenv(SITE_ENV, site_table(tmp_path, [mine]))
    assert sku_for("NVIDIA H100 80GB HBM3")["floors"]["gemm"]["floor"] == 0.8
    assert sku_for("NVIDIA H200")["sku"] == "H200 SXM"  # the others stay the shipped ones
    r = gpudoctor("check", "--snapshot", H100_DEEP, "--json",
                  env={"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": "", SITE_ENV: os.environ[SITE_ENV]})
    doc = json.loads(r.stdout)
    [gemm] = [f for f in doc["findings"] if f["key"] == "fabric.deep.figure[GPU 0 gemm]"]
    assert gemm["status"] == "warn" and "floor 0.80: below floor" in gemm["summary"], gemm["summary"]
    assert r.returncode == 1


def test_a_site_table_that_is_no_json_is_one_line_exit_3(tmp_path):
    p = tmp_path / "gpu_skus.json"
    p.write_text('{"schema": "gpudoctor.gpu_skus/1",\n "skus": [}\n')
    os.chmod(p, 0o644)
    r = gpudoctor("check", "--snapshot", H100_DEEP, env={"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": "", SITE_ENV: str(p)})
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 3 and len(lines) == 1 and f"{p}:2: " in lines[0], lines


@pytest.mark.parametrize("edit, mode, words", [
    (lambda s: s.update(memory_gbs=3.35), 0o644, "bad SKU entry: H100 SXM: memory_gbs 3.35 is not a memory bandwidth"),
    (lambda s: s["floors"]["gemm"].update(floor=0.9), 0o644, "bad SKU entry: H100 SXM gemm: floor 0.9 at or above its healthy"),
    (lambda s: None, 0o664, "refusing this site SKU table as root"),
])
def test_a_bad_site_table_is_one_line_exit_3(tmp_path, edit, mode, words):
    mine = copy.deepcopy(sku_for("NVIDIA H100 80GB HBM3"))
    edit(mine)
    path = site_table(tmp_path, [mine], mode)
    r = gpudoctor("check", "--snapshot", H100_DEEP,
                  env={"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": "", SITE_ENV: path})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and path in lines[0] and words in lines[0], lines


def test_a_bad_shipped_table_refuses_at_load(monkeypatch):
    bad = copy.deepcopy(table())
    h100(bad).update(memory_gbs=3.35)
    monkeypatch.setattr(deep_limits.json, "loads", lambda text, _orig=json.loads: bad)
    deep_limits._load.cache_clear()
    try:
        with pytest.raises(ConfigError) as exc:
            deep_limits._load(None)
        assert "gpu_skus.json: bad SKU entry: H100 SXM: memory_gbs 3.35" in exc.value.one_line()
    finally:
        deep_limits._load.cache_clear()


def test_an_assumed_floor_says_so_in_the_findings_text(tmp_path):
    from gpudoctor import snapshot
    from gpudoctor.diagnose import diagnose
    from gpudoctor.target import snapshot_facts

    child = dc.healthy_child()
    child["name"] = "NVIDIA H200 NVL"  # its floors are the H200 SXM's, assumed
    path = dc.write(dc.build(child), tmp_path / "deep.json")
    d = diagnose(snapshot_facts(snapshot.load(str(path))))
    by = {f.key: f for f in d.findings}
    d2d, gemm = by["fabric.deep.figure[GPU 0 d2d]"], by["fabric.deep.figure[GPU 0 gemm]"]
    assert "of the H200 NVL's memory bandwidth" in d2d.summary
    assert "floor 0.80 assumed from the H200 SXM's measurement" in d2d.summary, d2d.summary
    assert "floor 0.72 assumed from the H200 SXM's measurement" in gemm.summary, gemm.summary
    # measured floors say nothing of the kind
    child["name"] = "NVIDIA H200"
    d = diagnose(snapshot_facts(snapshot.load(str(dc.write(dc.build(child), tmp_path / "sxm.json")))))
    assert not [f.summary for f in d.findings if f.id == "fabric.deep.figure" and "assumed" in f.summary]
