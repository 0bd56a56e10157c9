# demo-domu.sh [-k KIT] [-n LINES] [-t TIMEOUT_S] [-f fp|nofp|exact] [-c VCPUS] [NAME] — for use
# INSIDE the ARM64 kit's dom0 (busybox sh): creates the demo unikernel domU NAME (default
# "uk") from domu.cfg.in with `xl create`, waits until its vUART log shows LINES (default 1)
# `split alpha=` lines, and prints the domid on stdout (all else on stderr). The build is
# uk-xen-nofp (CFI only) unless -f fp (frame records) or -f exact (the exact-count build;
# -n 0 returns once it is created). KIT defaults to $GLASS_KIT.
KIT="${GLASS_KIT:-}" LINES=1 TIMEOUT=180 VARIANT=nofp VCPUS=2
while getopts "k:n:t:f:c:" o; do
    case "$o" in
    k) KIT="$OPTARG" ;;
    n) LINES="$OPTARG" ;;
    t) TIMEOUT="$OPTARG" ;;
    f) VARIANT="$OPTARG" ;;
    c) VCPUS="$OPTARG" ;;
    *) echo "usage: demo-domu.sh [-k KIT] [-n LINES] [-t S] [-f fp|nofp|exact] [-c VCPUS] [NAME]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
NAME="${1:-uk}"
[ -n "$KIT" ] && [ -s "$KIT/uk-xen-$VARIANT.img" ] && [ -f "$KIT/domu.cfg.in" ] ||
    { echo "demo-domu: no kit with uk-xen-$VARIANT.img (give -k KIT or set GLASS_KIT)" >&2; exit 2; }
export PATH="/usr/lib/xen-4.17/bin:$PATH"
CFG="/run/$NAME.cfg"
sed -e "s|@NAME@|$NAME|g" -e "s|@KIT@|$KIT|g" -e "s|@VARIANT@|$VARIANT|g" -e "s|@VCPUS@|$VCPUS|g" \
    "$KIT/domu.cfg.in" >"$CFG"
rm -f /var/log/xen/console/guest-"$NAME"*.log
t0=$(date +%s)
xl create -q "$CFG" >&2 || { echo "demo-domu: xl create failed" >&2; exit 1; }
domid="$(xl domid "$NAME")"
echo "demo-domu: $NAME is domain $domid (xl create took $(($(date +%s) - t0)) s)" >&2
while :; do
    # xenconsoled logs the vUART in a file of its own beside guest-NAME.log.
    n=$(cat /var/log/xen/console/guest-"$NAME"*.log 2>/dev/null | grep -c '^split alpha=')
    [ "$n" -ge "$LINES" ] && break
    if ! xl list "$domid" >/dev/null 2>&1; then
        echo "demo-domu: domain $domid vanished; console:" >&2
        cat /var/log/xen/console/guest-"$NAME"*.log >&2 2>/dev/null
        exit 1
    fi
    if [ $(($(date +%s) - t0)) -gt "$TIMEOUT" ]; then
        echo "demo-domu: no $LINES split lines after $TIMEOUT s; console:" >&2
        ls -la /var/log/xen/console >&2
        cat /var/log/xen/console/guest-"$NAME"*.log >&2 2>/dev/null
        xl list >&2
        exit 1
    fi
    sleep 1
done
echo "$domid"
