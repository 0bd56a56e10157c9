#!/bin/sh
# ARM64 dom0 stage 2 (PID 1 in the kit's arm64 rootfs, busybox sh): start xenstored,
# xen-init-dom0 and xenconsoled (domU consoles logged to files), run the script named by
# glass_script= with its output on the console and in OUTDIR/script.log, keep the logs in
# OUTDIR, write OUTDIR/script.status (the script's exit code), power off.
export PATH=/usr/lib/xen-4.17/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C TERM=dumb
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
grep -q control_d /proc/xen/capabilities 2>/dev/null || fail "not the control domain (or xenfs not mounted)"
mkdir -p /run/xen /run/xenstored /var/lib/xen /var/lib/xenstored /var/log/xen/console
chmod 700 /run/xen
XENSTORED_ROOTDIR=/run/xenstored xenstored --pid-file /run/xenstored.pid || fail "xenstored did not start"
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
[ -e "$GLASS_SCRIPT" ] || fail "script '$GLASS_SCRIPT' not found in dom0 (is its directory bound?)"
up >"$GLASS_OUT/script.started"
log "running $GLASS_SCRIPT at uptime $(up)s"
rcfile=/run/script.rc
{ sh "$GLASS_SCRIPT" </dev/null 2>&1; echo $? >$rcfile; } | tee "$GLASS_OUT/script.log"
rc=$(cat $rcfile 2>/dev/null || echo 126)
log "script exited with status $rc at uptime $(up)s"
mkdir -p "$GLASS_OUT/console"
cp -f /var/log/xen/console/* "$GLASS_OUT/console/" 2>/dev/null
xl dmesg >"$GLASS_OUT/xen-dmesg.log" 2>&1
dmesg >"$GLASS_OUT/dom0-dmesg.log" 2>&1
cp -f /var/log/xen/*.log "$GLASS_OUT/" 2>/dev/null
echo "$rc" >"$GLASS_OUT/script.status"
power_off
