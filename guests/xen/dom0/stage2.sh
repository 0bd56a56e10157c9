#!/bin/bash
# dom0 stage 2 (PID 1 after the chroot into the host's root, bash from the host): start the
# Xen daemons (xenstored, xen-init-dom0, xenconsoled logging domU consoles to files), run the
# script named by glass_script= with its output on the console and in OUTDIR/script.log,
# save the logs to OUTDIR, write OUTDIR/script.status (the script's exit code), power off.
set -u
export PATH=/usr/lib/xen-4.17/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb
export GLASS_SCRIPT="${glass_script:-}" GLASS_OUT="${glass_out:-}" GLASS_KIT="${glass_kit:-}"
cd /
log() { echo "glass-dom0: $*"; }
up() { cut -d' ' -f1 /proc/uptime; }

power_off() {
    sync
    echo o >/proc/sysrq-trigger 2>/dev/null
    sleep 5
    busybox poweroff -f
    sleep 1000
}

fail() {
    log "FATAL: $*"
    [ -n "$GLASS_OUT" ] && echo 125 >"$GLASS_OUT/script.status"
    power_off
}

log "stage2 at uptime $(up)s"
[ -e /proc/xen/capabilities ] || fail "/proc/xen/capabilities missing: not running on Xen, or xenfs not mounted"
grep -q control_d /proc/xen/capabilities || fail "not the control domain"

mkdir -p /run/xen /run/xenstored /var/lib/xen /var/lib/xenstored /var/log/xen/console /tmp
chmod 700 /run/xen
XENSTORED_ROOTDIR=/run/xenstored xenstored --pid-file /run/xenstored.pid ||
    fail "xenstored did not start"
for _ in $(seq 1 300); do
    xenstore-read -s / >/dev/null 2>&1 && break
    sleep 0.1
done
xenstore-read -s / >/dev/null 2>&1 || fail "xenstored does not answer"
xen-init-dom0 >/dev/null || fail "xen-init-dom0 failed"
xenconsoled --log=guest --log-dir=/var/log/xen/console --pid-file=/run/xenconsoled.pid ||
    fail "xenconsoled did not start"
log "xen daemons up at uptime $(up)s"

[ -n "$GLASS_OUT" ] || fail "no glass_out= on the kernel command line"
[ -n "$GLASS_SCRIPT" ] || fail "no glass_script= on the kernel command line"
[ -e "$GLASS_SCRIPT" ] || fail "script $GLASS_SCRIPT not found (the host root is mounted read-only at /)"
up >"$GLASS_OUT/script.started"
log "running $GLASS_SCRIPT at uptime $(up)s"
if [ -x "$GLASS_SCRIPT" ]; then runner=("$GLASS_SCRIPT"); else runner=(bash "$GLASS_SCRIPT"); fi
("${runner[@]}" </dev/null 2>&1) | tee "$GLASS_OUT/script.log"
rc=${PIPESTATUS[0]}
log "script exited with status $rc at uptime $(up)s"

# Keep what a post-mortem needs on the host side.
mkdir -p "$GLASS_OUT/console"
cp -f /var/log/xen/console/* "$GLASS_OUT/console/" 2>/dev/null
xl dmesg >"$GLASS_OUT/xen-dmesg.log" 2>&1
dmesg >"$GLASS_OUT/dom0-dmesg.log" 2>&1
cp -f /var/log/xen/*.log "$GLASS_OUT/" 2>/dev/null
echo "$rc" >"$GLASS_OUT/script.status"
power_off
