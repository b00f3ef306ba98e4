"""Parsers over real H200 captures (shared/fixtures, copied into tests/fixtures/captures)."""

from gpudoctor.gather.driver import parse_nvidia_smi_xml
from gpudoctor.gather.fabric import decode_pcie, parse_topo
from gpudoctor.gather.hostinfo import parse_driver_version, parse_proc_devices
from gpudoctor.gather.workload import mount_of, parse_mounts

from .conftest import CAPTURES, capture, capture_rc


def config_bytes(host):
    return bytes.fromhex("".join((CAPTURES / host / "pci-0000:00:06.0.config.hex").read_text().split()))


def test_nvidia_smi_xml_of_a_real_h200():
    d = parse_nvidia_smi_xml(capture("h200-healthy", "nvidia-smi-qx.txt"))
    assert d["driver_version"] == "580.159.04" and d["cuda_version"] == "13.0"
    (g,) = d["gpus"]
    assert g["name"] == "NVIDIA H200" and g["minor"] == 0 and g["bus_id"] == "00000000:00:06.0"
    assert g["persistence_mode"] == "Enabled"
    assert g["pcie"] == {"gen_max": 5, "gen_current": 5, "width_max": 16, "width_current": 16}
    assert g["ecc_volatile_uncorrectable"] == 0 and g["remapped_rows"]["pending"] == "No"
    assert g["clock_event_reasons"]["gpu_idle"] is True and g["clock_event_reasons"]["hw_slowdown"] is False
    assert g["memory_total_mib"] == 143771


def test_nvidia_smi_blocked_control_node_exits_17():
    assert capture_rc("h200-ctl-blocked", "nvidia-smi-qx.txt") == 17
    assert "GPU access blocked by the operating system" in capture("h200-ctl-blocked", "nvidia-smi-qx.txt")


def test_pcie_capability_decoded_from_real_config_space():
    p = decode_pcie(config_bytes("h200-healthy"))
    assert p["found"] and p["cap_offset"] == 0x60
    assert (p["mps"], p["mrrs"], p["mps_supported"]) == (256, 4096, 256)
    assert (p["link_speed"], p["link_width"]) == (5, 16)


def test_short_config_read_is_not_a_value():
    raw = config_bytes("h200-healthy")
    assert decode_pcie(raw[:64]) == {"readable": False, "bytes": 64}
    assert decode_pcie(None) == {"readable": False, "bytes": 0}


def test_mrrs_bits_follow_devctl():
    raw = bytearray(config_bytes("h200-healthy"))
    ctl = int.from_bytes(raw[0x68:0x6A], "little")
    ctl = (ctl & ~0x7000) | (2 << 12)  # MRRS 512
    raw[0x68:0x6A] = ctl.to_bytes(2, "little")
    assert decode_pcie(bytes(raw))["mrrs"] == 512


def test_proc_devices_live_majors():
    d = parse_proc_devices(capture("h200-healthy", "proc-devices.txt"))
    assert d["char"]["nvidia-uvm"] == 238 and d["char"]["nvidia"] == 195 and d["char"]["nvidia-caps"] == 241
    assert d["char"]["mem"] == 1 and d["block"]["virtblk"] == 254


def test_driver_version_file():
    v = parse_driver_version(capture("h200-healthy", "driver-version.txt"))
    assert v["version"] == "580.159.04" and v["open"] is True


def test_topo_single_gpu():
    t = parse_topo(capture("h200-healthy", "nvidia-smi-topo.txt"))
    assert t["gpus"] == ["GPU0"] and t["pairs"] == {} and t["affinity"]["GPU0"]["cpus"] == "0-15"


def test_topo_eight_gpus_two_numa_nodes():
    # The shape of `nvidia-smi topo -m` on an 8-GPU, 2-socket PCIe box, derived from the real single-GPU output.
    t = eight_gpu_topo()
    assert len(t["gpus"]) == 8
    assert t["pairs"]["GPU0-GPU4"] == "SYS" and t["pairs"]["GPU0-GPU3"] == "NODE"
    assert t["affinity"]["GPU5"] == {"cpus": "32-63", "numa": "1"}


def test_mounts_last_mount_of_dev_shm_wins():
    ms = parse_mounts(capture("h200-uvmtools-000", "mounts.txt"))
    m = mount_of(ms, "/dev/shm")
    assert m["fstype"] == "tmpfs" and "size=67108864k" in m["options"]
    assert mount_of(ms, "/dev/shm/models/x")["target"] == "/dev/shm"
    assert mount_of(ms, "/usr/local/nvidia/lib64")["fstype"] == "squashfs"


def eight_gpu_topo():
    hdr = "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    rows = []
    for i in range(8):
        cells = ["X" if i == j else ("NODE" if (i < 4) == (j < 4) else "SYS") for j in range(8)]
        rows.append("\t".join([f"GPU{i}", *cells, "0-31" if i < 4 else "32-63", "0" if i < 4 else "1", "N/A"]))
    return parse_topo("\n".join([hdr, *rows, "", "Legend:"]))


def test_tp_group_advice_on_two_socket_box():
    from gpudoctor.gather.fabric import tp_groups

    topo = eight_gpu_topo()
    tp4 = tp_groups(topo, 4)
    assert [g["gpus"] for g in tp4] == [["GPU0", "GPU1", "GPU2", "GPU3"], ["GPU4", "GPU5", "GPU6", "GPU7"]]
    assert all(g["worst_link"] == "NODE" and len(g["numa_nodes"]) == 1 for g in tp4)
    (tp8,) = tp_groups(topo, 8)
    assert tp8["worst_link"] == "SYS" and tp8["numa_nodes"] == ["0", "1"]


def test_tp_advice_finding():
    from gpudoctor.diagnose import diagnose

    facts = {"fabric": {"gpus": [], "topo": eight_gpu_topo()}, "meta": {"context": {}}}
    f = diagnose(facts).by_key()["fabric.topo.tp_groups"]
    assert f.summary.startswith("TP8+ groups must span NUMA nodes")
    assert "TP4: 0,1,2,3 — worst link NODE, NUMA 0" in f.evidence


def test_p2p_matrix_findings():
    from gpudoctor.diagnose import diagnose

    text = ("\t\x1b[4mGPU0\tGPU1\tGPU2\t\x1b[0m\n GPU0\tX\tOK\tNS\t\n GPU1\tOK\tX\tOK\t\n GPU2\tNS\tOK\tX\t\n\nLegend:\n")
    pairs = parse_topo(text)["pairs"]
    assert pairs["GPU0-GPU2"] == "NS" and pairs["GPU1-GPU0"] == "OK"
    f = diagnose({"fabric": {"gpus": [], "p2p_read": pairs}, "meta": {"context": {}}}).by_key()["fabric.topo.p2p"]
    assert f.status.value == "warn" and "GPU0-GPU2 NS (not supported)" in f.summary
    ok = {k: "OK" for k in pairs}
    f = diagnose({"fabric": {"gpus": [], "p2p_read": ok}, "meta": {"context": {}}}).by_key()["fabric.topo.p2p"]
    assert f.status.value == "ok" and "all 3 GPU pair(s)" in f.summary
