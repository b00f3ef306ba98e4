#!/bin/bash
# Capture gpudoctor snapshots of a GPU host: healthy, and faults injected in private mount namespaces.
# Nothing on the machine is changed: every fault is a bind mount that vanishes with its namespace.
# Usage: [PREFIX=h200] tools/capture_snapshots.sh OUTDIR   (as root, on the GPU host)
set -u
O=${1:?outdir}; mkdir -p "$O"
P=${PREFIX:-h200}
G=${GPUDOCTOR:-gpudoctor}
snap() { local name=$1; shift; "$@" "$G" snapshot -o "$O/$name.json" 2>>"$O/capture.log"; "$@" "$G" check > "$O/$name.check.txt" 2>&1; echo "# rc=$?" >> "$O/$name.check.txt"; }
snap $P-healthy env
# A: nvidia-uvm unusable (bound to /dev/null, node now 1:3): NVML fine, cuInit 999 — the seed's signature
snap $P-uvm-blocked unshare -m bash -c 'mount --bind /dev/null /dev/nvidia-uvm && exec "$@"' _
# B: control node unusable: NVML 17 "GPU access blocked by the operating system", cuInit 100
snap $P-ctl-blocked unshare -m bash -c 'mount --bind /dev/null /dev/nvidiactl && exec "$@"' _
# C: nvidia-uvm-tools mode 000 and an empty 64 GiB tmpfs on /dev/shm (the post-reboot state)
U=$(awk '$2=="nvidia-uvm"{print $1}' /proc/devices)
snap $P-uvmtools-000 unshare -m bash -c 'd=$(mktemp -d); mknod -m 000 $d/t c '"$U"' 1; mount --bind $d/t /dev/nvidia-uvm-tools; mount -t tmpfs -o size=64g tmpfs /dev/shm; exec "$@"' _
# D: nvidia-uvm node left with a stale major after a driver update (509: not registered here)
snap $P-uvm-stale-major unshare -m bash -c 'd=$(mktemp -d); mknod -m 666 $d/u c 509 0; mount --bind $d/u /dev/nvidia-uvm; exec "$@"' _
# E: nvidia-uvm node missing (a /dev without it)
snap $P-uvm-missing unshare -m bash -c 'd=$(mktemp -d); for n in null zero random urandom full tty; do cp -a /dev/$n $d/; done; for n in /dev/nvidia*; do [ "$n" = /dev/nvidia-uvm ] || cp -a $n $d/; done; mkdir $d/shm $d/pts; mount --bind $d /dev && exec "$@"' _
ls -la "$O"
