#!/bin/bash
# kit.sh OUT — builds the kit for testing glass's Xen backend under QEMU/TCG: OUT/xen (the
# gunzipped hypervisor QEMU boots as multiboot), OUT/vmlinuz (Debian's 6.1 kernel, dom0 and
# domU alike), OUT/dom0.cpio.gz (busybox + modules; mounts the host root over 9p, see
# dom0/init), OUT/split (+ split.syms) and OUT/domu.cpio.gz (the known-split PV workload).
# Installs the Debian packages it needs first. Idempotent: a step whose output exists and is
# newer than its sources is skipped; `rm -rf OUT` for a clean build.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
log() { echo "kit: $*" >&2; }
# shellcheck source=../../scripts/kit-lib.sh
. "$HERE/../../scripts/kit-lib.sh"

# --- 1. packages -----------------------------------------------------------------------
# qemu-system-xen: the device model of HVM guests (xl's device_model_override=
# /usr/libexec/xen-qemu-system-i386); PV and PVH guests need none.
PKGS=(xen-hypervisor-4.17-amd64 xen-utils-4.17 libxen-dev busybox-static qemu-system-x86
      qemu-system-xen kmod cpio gzip gcc libc6-dev binutils)
need_debs --no-install-recommends "${PKGS[@]}"
apt_updated=0
apt_update() { [ $apt_updated = 1 ] || { log "apt-get update"; apt-get update -qq; apt_updated=1; }; }

# --- 2. hypervisor -----------------------------------------------------------------------
XENGZ=/boot/xen-4.17-amd64.gz
if ! fresh "$OUT/xen" "$XENGZ"; then
    log "xen <- $XENGZ"
    gunzip -c "$XENGZ" >"$OUT/xen.tmp" && mv "$OUT/xen.tmp" "$OUT/xen"
fi

# --- 3. kernel + modules (Debian's linux-image, extracted, never installed) ----------------
DOM0_MODS=(9p 9pnet 9pnet_virtio virtio_pci overlay xen-privcmd xenfs xen-evtchn xen-gntdev
           xen-gntalloc xen-blkback xen-netback)
if [ ! -s "$OUT/vmlinuz" ] || [ ! -s "$OUT/modules/load.order" ]; then
    kpkg="${GLASS_XEN_KPKG:-}"
    if [ -z "$kpkg" ]; then
        kpkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
        if [ -z "$kpkg" ]; then
            apt_update
            kpkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
        fi
    fi
    [ -n "$kpkg" ] || { log "cannot tell which linux-image-6.1.0-NN-amd64 to fetch"; exit 1; }
    work="$OUT/.kernel-work"
    rm -rf "$work"
    mkdir -p "$work/x"
    log "downloading $kpkg"
    # apt drops privileges to _apt for downloads: give it a directory it can write.
    chmod 777 "$work"
    (cd "$work" && apt-get download -q "$kpkg") ||
        { apt_update; (cd "$work" && apt-get download -q "$kpkg"); }
    dpkg-deb -x "$work"/*.deb "$work/x"
    kver="$(ls "$work/x/lib/modules" | head -n1)"
    moddir="$work/x/lib/modules/$kver"
    depmod -b "$work/x" "$kver"
    rm -rf "$OUT/modules"
    mkdir -p "$OUT/modules"
    # Load order: for each wanted module its dependencies (modules.dep lists them so that
    # the last is loaded first), then the module; modules built into the kernel are skipped.
    declare -A seen=()
    order=()
    for m in "${DOM0_MODS[@]}"; do
        re="/${m//[-_]/[-_]}\.ko(\.[a-z]+)?:"
        line="$(grep -E "$re" "$moddir/modules.dep" || true)"
        if [ -z "$line" ]; then
            if grep -qE "/${m//[-_]/[-_]}\.ko" "$moddir/modules.builtin"; then
                log "module $m is built in"
                continue
            fi
            log "module $m not found in $kpkg"
            exit 1
        fi
        self="${line%%:*}"
        read -r -a deps <<<"${line#*:}"
        list=()
        for ((i = ${#deps[@]} - 1; i >= 0; i--)); do list+=("${deps[i]}"); done
        list+=("$self")
        for f in "${list[@]}"; do
            [ -n "${seen[$f]:-}" ] && continue
            seen[$f]=1
            order+=("$(basename "$f")")
            cp "$moddir/$f" "$OUT/modules/"
        done
    done
    printf '%s\n' "${order[@]}" >"$OUT/modules/load.order"
    cp "$work/x/boot/config-$kver" "$OUT/kernel.config"
    echo "$kpkg $kver" >"$OUT/kernel.version"
    cp "$work/x/boot/vmlinuz-$kver" "$OUT/vmlinuz.tmp" && mv "$OUT/vmlinuz.tmp" "$OUT/vmlinuz"
    rm -rf "$work"
    log "kernel $kver, dom0 modules: ${order[*]}"
fi

BUSYBOX=/bin/busybox

# --- 4. dom0 initramfs ---------------------------------------------------------------------
if ! fresh "$OUT/dom0.cpio.gz" "$HERE/dom0/init" "$HERE/dom0/stage2.sh" "$OUT/modules/load.order" "$BUSYBOX"; then
    log "dom0.cpio.gz"
    st="$OUT/.dom0-root"
    rm -rf "$st"
    mkdir -p "$st"/{bin,dev,proc,sys,lib/modules}
    cp "$BUSYBOX" "$st/bin/busybox"
    cp "$HERE/dom0/init" "$st/init"
    cp "$HERE/dom0/stage2.sh" "$st/stage2.sh"
    chmod 755 "$st/init" "$st/stage2.sh"
    cp "$OUT"/modules/* "$st/lib/modules/"
    mknod -m 600 "$st/dev/console" c 5 1
    mkcpio "$st" "$OUT/dom0.cpio.gz"
    rm -rf "$st"
fi

# --- 5. the split workload and the domU initramfs -------------------------------------------
if ! fresh "$OUT/split" "$HERE/linux/split.c"; then
    log "split"
    gcc -static -no-pie -O2 -g -fno-omit-frame-pointer -fno-builtin-gamma -pthread -Wall \
        -o "$OUT/split.tmp" "$HERE/linux/split.c"
    mv "$OUT/split.tmp" "$OUT/split"
fi
if ! fresh "$OUT/split.syms" "$OUT/split"; then
    # System.map-style table (xenctx -s, nm-based symbolizers)
    nm -n "$OUT/split" >"$OUT/split.syms"
fi
if ! fresh "$OUT/domu.cpio.gz" "$OUT/split" "$HERE/linux/init" "$HERE/linux/kernel-split.sh" "$BUSYBOX"; then
    log "domu.cpio.gz"
    st="$OUT/.domu-root"
    rm -rf "$st"
    mkdir -p "$st"/{bin,dev,proc,sys}
    cp "$BUSYBOX" "$st/bin/busybox"
    ln -s busybox "$st/bin/sh"
    cp "$HERE/linux/init" "$st/init"
    cp "$HERE/linux/kernel-split.sh" "$st/kernel-split.sh"
    chmod 755 "$st/init" "$st/kernel-split.sh"
    cp "$OUT/split" "$st/split" # the very ELF given to the profiler as --symbols
    mknod -m 600 "$st/dev/console" c 5 1
    mkcpio "$st" "$OUT/domu.cpio.gz"
    rm -rf "$st"
fi
if ! fresh "$OUT/domu.cfg.in" "$HERE/linux/domu.cfg.in"; then
    cp "$HERE/linux/domu.cfg.in" "$OUT/domu.cfg.in"
fi
log "ready: $OUT ($(cat "$OUT/kernel.version"))"
