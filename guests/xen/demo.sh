#!/bin/bash
# The dom0 side of `./x demo`'s Xen part (run.sh runs it in the nested Xen's dom0): starts
# the PV demo unikernel ($GLASS_OUT/pv/uk-pv.elf, built by the host) with its vCPUs on
# pCPU 1 and dom0 alone on pCPU 0, and records it with glass from dom0, as a user would:
#   glass record --xen uk -F 499 -d 5 --symbols uk-pv.elf -o xen.glass
set -uo pipefail
export PATH="/usr/lib/xen-4.17/bin:$PATH"
OUT="$GLASS_OUT"
GLASS="$(cat "$OUT/glass-path")"
ELF="$OUT/pv/uk-pv.elf"
xl vcpu-pin Domain-0 all 0 >/dev/null 2>&1
# Xen 4.17 schedules with credit2 by default, where `xl sched-credit` fails (it did,
# silently, until 2026-11-28: dom0 ran at the default weight, 256).
xl sched-credit2 -d 0 -w 4096 >/dev/null 2>&1 || xl sched-credit -d 0 -w 4096 >/dev/null 2>&1 || true
cat >/run/uk.cfg <<CFG
name = "uk"
type = "pv"
kernel = "$ELF"
memory = 32
vcpus = 2
cpus = ["1", "1"]
tsc_mode = "native"
on_poweroff = "destroy"
CFG
xl create -q /run/uk.cfg || exit 1
log=/var/log/xen/console/guest-uk.log
for _ in $(seq 1 300); do grep -q '^split' "$log" 2>/dev/null && break; sleep 0.2; done
xl list
echo "== glass record --xen uk -F 499 -d 5 --symbols uk-pv.elf -o xen.glass   (in dom0)"
"$GLASS" record --xen uk -F 499 -d 5 --symbols "$ELF" -o "$OUT/xen.glass"
rc=$?
echo "== the guest's own split: $(tr -d '\r' <"$log" | grep '^split' | tail -1)"
xl destroy uk
exit $rc
