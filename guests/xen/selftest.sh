#!/bin/bash
# selftest.sh — the dom0 smoke test of the Xen kit (run it with run.sh, not on the host):
# shows `xl info`, starts the split PV domU, waits for 2 split lines, checks the reported
# split is near 60/30/10 and delta runs, shows `xl list`, the console and one xenctx, then
# destroys the domU. Exits 0 when all of that worked.
#   guests/xen/run.sh KIT guests/xen/selftest.sh OUTDIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/lib/xen-4.17/bin:$PATH"
KIT="${GLASS_KIT:?GLASS_KIT unset: run me inside the kit dom0 via run.sh}"
NAME=selftest
up() { cut -d' ' -f1 /proc/uptime; }

echo "== xl info (dom0 uptime $(up)s)"
xl info | grep -E '^(release|nr_cpus|total_memory|free_memory|xen_version|xen_caps|virt_caps|xen_commandline)' || true

t0=$(date +%s%3N)
domid="$("$HERE/demo-domu.sh" -k "$KIT" -n 2 -t 150 "$NAME")"
t1=$(date +%s%3N)
echo "== domU $NAME is domid $domid; 2 split lines after $(((t1 - t0) / 1000)).$(((t1 - t0) % 1000 / 100)) s"

echo "== xl list"
xl list
echo "== xl vcpu-list $domid"
xl vcpu-list "$domid"

LOG="/var/log/xen/console/guest-$NAME.log"
echo "== console ($LOG)"
tr -d '\r' <"$LOG"

echo "== xenctx -f -S $domid 0 (symbols: $KIT/split.syms)"
timeout 30 xenctx -s "$KIT/split.syms" -f -S "$domid" 0 || echo "(xenctx exited $?)"

# The split line must settle within 5 points of 60/30/10 (cumulative: noisy while the
# rounds are few, e.g. on a loaded host); give it up to 40 s more.
check_split() { # one awk per try: dom0 forks are slow under TCG
    last="$(awk '/^split alpha=/ { sub(/\r$/, ""); l = $0 } END { print l }' "$LOG")"
    awk -v l="$last" 'BEGIN {
        n = split("alpha 60 beta 30 gamma 10", w, " ")
        for (i = 1; i < n; i += 2) {
            if (!match(l, w[i] "=[0-9.]+%")) exit 1
            g = substr(l, RSTART + length(w[i]) + 1, RLENGTH - length(w[i]) - 2) + 0
            if (g < w[i + 1] - 5 || g > w[i + 1] + 5) exit 1
        }
    }'
}
ok=1
for _ in $(seq 1 40); do
    check_split && break
    sleep 1
done
check_split || { echo "FAIL: split far from 60/30/10: $last"; ok=0; }
grep -q '^delta rounds=' "$LOG" || { echo "FAIL: no delta line"; ok=0; }
xl destroy "$domid"
echo "== destroyed $domid; xl list:"
xl list
[ $ok = 1 ] || exit 1
echo "selftest: PASS ($last)"
