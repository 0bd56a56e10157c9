#!/bin/bash
# kit.sh OUT — builds the kit for testing glass's Xen backend on ARM64 under QEMU/TCG
# (qemu-system-aarch64 -M virt,virtualization=on): OUT/xen (Debian's xen-hypervisor-4.17-arm64,
# an arm64 Image QEMU boots as -kernel), OUT/Image (Debian's arm64 linux-image, dom0's kernel),
# OUT/dom0.cpio.gz (arm64 busybox + modules; see dom0/init), OUT/rootfs (dom0's root: the
# arm64 .debs of xen-utils-4.17, its libraries, libc and busybox, extracted with dpkg-deb -x,
# never installed; dom0 mounts it over 9p), and the domU: OUT/uk-xen-{fp,nofp,exact}.{img,elf}
# (guests/aarch64 built for Xen's guest memory map; exact: the exact-count build), OUT/domu.cfg.in and OUT/demo-domu.sh.
# Installs the host packages it needs first (dpkg --add-architecture arm64 for the
# downloads). Idempotent: a step whose output is newer than its sources is skipped.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
log() { echo "kit-arm64: $*" >&2; }
# shellcheck source=../../scripts/kit-lib.sh
. "$HERE/../../scripts/kit-lib.sh"

# --- 1. host packages and the arm64 package lists ---------------------------------------
need_debs --no-install-recommends qemu-system-arm gcc-aarch64-linux-gnu binutils-aarch64-linux-gnu \
    kmod cpio gzip python3
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "dpkg --add-architecture arm64"
    dpkg --add-architecture arm64
    apt-get update -qq
fi

# --- 2. the arm64 .debs: Xen, dom0's userspace, dom0's kernel --------------------------------
# xen-utils-4.17's runtime closure (apt-cache depends, less python3 and the init scripts'
# helpers, which the kit does not run), libc, busybox for the shells.
DEBS=(xen-hypervisor-4.17-arm64 xen-utils-4.17 xen-utils-common xenstore-utils libxenmisc4.17
      libxencall1 libxenforeignmemory1 libxengnttab1 libxenevtchn1 libxentoollog1
      libxentoolcore1 libxendevicemodel1 libxenhypfs1 libxenstore4 libyajl2 libc6 libgcc-s1
      libncurses6 libtinfo6 libfdt1 libuuid1 libext2fs2 libcom-err2 zlib1g liblzma5
      libbz2-1.0 libzstd1 liblzo2-2 busybox-static)
DEB_STAMP="$OUT/debs/.stamp"
want="$(printf '%s\n' "${DEBS[@]}" "${GLASS_XEN_ARM64_KPKG:-linux-image-arm64}")"
if [ ! -e "$DEB_STAMP" ] || [ "$(cat "$DEB_STAMP")" != "$want" ]; then
    kpkg="${GLASS_XEN_ARM64_KPKG:-}"
    if [ -z "$kpkg" ]; then
        kpkg="$(apt-cache depends linux-image-arm64:arm64 | awk '/Depends: linux-image-[0-9]/{sub(/:arm64$/, "", $2); print $2; exit}')"
        if [ -z "$kpkg" ]; then
            apt-get update -qq
            kpkg="$(apt-cache depends linux-image-arm64:arm64 | awk '/Depends: linux-image-[0-9]/{sub(/:arm64$/, "", $2); print $2; exit}')"
        fi
    fi
    [ -n "$kpkg" ] || { log "cannot tell which linux-image-6.1.0-NN-arm64 to fetch"; exit 1; }
    rm -rf "$OUT/debs"
    mkdir -p "$OUT/debs"
    # apt drops privileges to _apt for downloads: give it a directory it can write.
    chmod 777 "$OUT/debs"
    log "downloading ${#DEBS[@]} arm64 packages and $kpkg"
    args=()
    for p in "${DEBS[@]}" "$kpkg"; do args+=("$p:arm64"); done
    (cd "$OUT/debs" && apt-get download -q "${args[@]}") >/dev/null ||
        { apt-get update -qq; (cd "$OUT/debs" && apt-get download -q "${args[@]}") >/dev/null; }
    echo "$want" >"$DEB_STAMP"
fi

# --- 3. dom0's root filesystem --------------------------------------------------------------
ROOT="$OUT/rootfs"
if ! fresh "$ROOT/.stamp" "$DEB_STAMP" "$HERE/dom0/stage2.sh" "$HERE/kit.sh"; then
    log "rootfs"
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    for d in "$OUT"/debs/*.deb; do
        case "$(basename "$d")" in linux-image-*) continue ;; esac
        dpkg-deb -x "$d" "$ROOT"
    done
    # Debian 12's arm64 libc6 puts its libraries under /lib (not merged-usr in the .deb).
    mkdir -p "$ROOT"/{proc,sys,dev,run,tmp,root,var/lib/xen,var/log/xen,host} "$ROOT/usr/local/bin"
    ln -s /run "$ROOT/var/run"
    rm -rf "$ROOT/usr/share/doc" "$ROOT/usr/share/man" "$ROOT/usr/lib/aarch64-linux-gnu/gconv"
    # The applets as links, so that /bin/sh and the usual tools exist before PID 1 runs.
    for applet in sh ash cat cp cut date dd echo env grep head kill ls mkdir mount mv \
        ps rm seq sleep sort tail tee test timeout tr umount uname wc awk sed find xargs \
        readlink dirname basename printf expr true false stat chmod ln sync dmesg od; do
        [ -e "$ROOT/bin/$applet" ] || ln -s busybox "$ROOT/bin/$applet"
    done
    cp "$HERE/dom0/stage2.sh" "$ROOT/stage2.sh"
    chmod 755 "$ROOT/stage2.sh"
    touch "$ROOT/.stamp"
fi
[ -x "$ROOT/usr/lib/xen-4.17/bin/xl" ] || { log "xl missing from $ROOT"; exit 1; }

# --- 4. hypervisor and dom0 kernel + modules --------------------------------------------------
if ! fresh "$OUT/xen" "$DEB_STAMP"; then
    cp "$ROOT/boot/xen-4.17-arm64" "$OUT/xen.tmp" && mv "$OUT/xen.tmp" "$OUT/xen"
fi
DOM0_MODS=(virtio_mmio 9p 9pnet_virtio overlay xen-privcmd xenfs xen-evtchn xen-gntdev xen-gntalloc)
if ! fresh "$OUT/modules/load.order" "$DEB_STAMP"; then
    work="$OUT/.kernel-work"
    rm -rf "$work" "$OUT/modules"
    mkdir -p "$work" "$OUT/modules"
    dpkg-deb -x "$OUT"/debs/linux-image-*.deb "$work"
    kver="$(ls "$work/lib/modules" | head -n1)"
    depmod -b "$work" "$kver"
    # modprobe --show-depends lists each module's dependencies first, as insmod lines.
    for m in "${DOM0_MODS[@]}"; do
        modprobe -S "$kver" -d "$work" --show-depends "$m" ||
            { log "module $m not in $kver"; exit 1; }
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$work/order"
    while read -r f; do
        cp "$f" "$OUT/modules/"
        basename "$f"
    done <"$work/order" >"$OUT/modules/load.order.tmp"
    cp "$work/boot/vmlinuz-$kver" "$OUT/Image"
    cp "$work/boot/config-$kver" "$OUT/kernel.config"
    echo "$kver" >"$OUT/kernel.version"
    mv "$OUT/modules/load.order.tmp" "$OUT/modules/load.order"
    rm -rf "$work"
    log "kernel $kver, dom0 modules: $(tr '\n' ' ' <"$OUT/modules/load.order")"
fi

# --- 5. dom0 initramfs: busybox, the modules, init ----------------------------------------------
if ! fresh "$OUT/dom0.cpio.gz" "$HERE/dom0/init" "$OUT/modules/load.order" "$ROOT/.stamp"; then
    log "dom0.cpio.gz"
    st="$OUT/.dom0-initramfs"
    rm -rf "$st"
    mkdir -p "$st"/{bin,dev,proc,sys,lib/modules}
    cp "$ROOT/bin/busybox" "$st/bin/busybox"
    cp "$HERE/dom0/init" "$st/init"
    chmod 755 "$st/init"
    cp "$OUT"/modules/* "$st/lib/modules/"
    mknod -m 600 "$st/dev/console" c 5 1
    mkcpio "$st" "$OUT/dom0.cpio.gz"
    rm -rf "$st"
fi

# --- 6. the domU: guests/aarch64 for Xen's guest memory map -------------------------------------
UK_SRC=("$HERE"/../aarch64/*.[chS] "$HERE"/../aarch64/build.sh "$HERE"/../demo/work.h "$HERE"/../demo/text_hash.h)
if ! fresh "$OUT/uk-xen-nofp.img" "${UK_SRC[@]}"; then
    log "uk-xen (guests/aarch64/build.sh $OUT 0 xen)"
    "$HERE/../aarch64/build.sh" "$OUT" 0 xen >&2
fi
# The exact-count build that glass trace --xen traces whole (crates/glass/tests/
# xen_arm64_dom0.sh): idle 12 s, 20 rounds, idle 4 s, then rounds forever, hashing its
# own .text with every split line (guests/aarch64/kernel.c).
if ! fresh "$OUT/uk-xen-exact.img" "${UK_SRC[@]}"; then
    log "uk-xen-exact (the exact-count build)"
    AARCH64_DEFINES="-DSTART_IDLE_MS=12000 -DEXACT_ROUNDS=20 -DHOLD_MS=4000" \
        "$HERE/../aarch64/build.sh" "$OUT/exact" 0 xen >&2
    for f in img elf; do cp -f "$OUT/exact/uk-xen-fp.$f" "$OUT/uk-xen-exact.$f"; done
    rm -rf "$OUT/exact"
fi
# dom0 sees the kit at its host path whatever else it is given: scripts find these there.
cp -f "$HERE/domu.cfg.in" "$HERE/demo-domu.sh" "$OUT/"
log "ready: $OUT (dom0 kernel $(cat "$OUT/kernel.version"))"
