#!/bin/bash
# demo-domu.sh [-k KIT] [-n LINES] [-t TIMEOUT_S] [-e KERNEL_ARGS] [NAME] — for use INSIDE
# the kit's dom0: creates the split PV domU NAME (default "split") from linux/domu.cfg.in with
# `xl create`, waits until its console log (xenconsoled:
# /var/log/xen/console/guest-NAME.log) shows LINES (default 1) `split alpha=` lines and
# prints the domid on stdout (all else goes to stderr). KIT defaults to $GLASS_KIT, which
# the dom0 stage2 exports. Env DOMU_MEMORY (MB), DOMU_VCPUS and DOMU_RAMDISK override the template.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KIT="${GLASS_KIT:-}" LINES=1 TIMEOUT=120 EXTRA=""
while getopts "k:n:t:e:" o; do
    case "$o" in
    k) KIT="$OPTARG" ;;
    n) LINES="$OPTARG" ;;
    t) TIMEOUT="$OPTARG" ;;
    e) EXTRA="$OPTARG" ;;
    *) echo "usage: $0 [-k KIT] [-n LINES] [-t TIMEOUT_S] [-e KERNEL_ARGS] [NAME]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
NAME="${1:-split}"
[ -n "$KIT" ] && [ -s "$KIT/vmlinuz" ] && [ -s "$KIT/domu.cpio.gz" ] ||
    { echo "demo-domu: no kit (give -k KIT or set GLASS_KIT)" >&2; exit 2; }
TEMPLATE="$HERE/linux/domu.cfg.in" # the kit's copy only when this tree lacks it
[ -f "$TEMPLATE" ] || TEMPLATE="$KIT/domu.cfg.in"
export PATH="/usr/lib/xen-4.17/bin:$PATH"

CFG="/run/glass/$NAME.cfg"
LOG="/var/log/xen/console/guest-$NAME.log"
mkdir -p /run/glass
sed -e "s|@NAME@|$NAME|g" -e "s|@KIT@|$KIT|g" -e "s|@EXTRA@|$EXTRA|g" "$TEMPLATE" >"$CFG"
[ -z "${DOMU_RAMDISK:-}" ] || sed -i "s|^ramdisk *=.*|ramdisk = \"$DOMU_RAMDISK\"|" "$CFG"
[ -z "${DOMU_MEMORY:-}" ] || sed -i "s|^memory *=.*|memory = $DOMU_MEMORY|" "$CFG"
[ -z "${DOMU_VCPUS:-}" ] || sed -i "s|^vcpus *=.*|vcpus = $DOMU_VCPUS|" "$CFG"
rm -f "$LOG"

now_ms() { local s=$EPOCHREALTIME; echo $((${s/./} / 1000)); }
# Count the split lines in the console log without forking (dom0 forks are slow under TCG).
count_split() {
    nsplit=0
    [ -f "$LOG" ] || return 0
    local l
    while IFS= read -r l; do [[ $l == "split alpha="* ]] && nsplit=$((nsplit + 1)); done <"$LOG"
    return 0
}
since() { local ms=$(($(now_ms) - t0)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }

t0=$(now_ms)
xl create -q "$CFG" >&2
domid="$(xl domid "$NAME")"
echo "demo-domu: $NAME is domain $domid (xl create took $(since) s); console log $LOG" >&2
i=0
while :; do
    count_split
    [ "$nsplit" -ge "$LINES" ] && break
    i=$((i + 1))
    if [ $((i % 25)) = 0 ] && ! xl list "$domid" >/dev/null 2>&1; then
        echo "demo-domu: domain $domid vanished; console:" >&2
        cat "$LOG" >&2 2>/dev/null || true
        exit 1
    fi
    if [ $(($(now_ms) - t0)) -gt $((TIMEOUT * 1000)) ]; then
        echo "demo-domu: no $LINES split line(s) after $TIMEOUT s; console so far:" >&2
        cat "$LOG" >&2 2>/dev/null || true
        exit 1
    fi
    sleep 0.2
done
echo "demo-domu: $LINES split line(s) $(since) s after xl create" >&2
echo "$domid"
