#!/bin/bash
# kit.sh KIT [ARCH...] — builds the Linux guest kit for plain QEMU guests (run.sh boots it),
# for x86_64 and aarch64 (default: both). Per ARCH, in KIT/ARCH/:
#   kernel              Debian 12's kernel (bzImage / Image), from its linux-image .deb
#   initramfs.cpio.gz   busybox-static (the ARCH's .deb), init, userspin, the modules
#   userspin, userspin.syms   the user-space spinner (ELF with symbols; nm -n)
#   modules/            the modules init loads (virtio disk), load.order
#   userspin-dyn        the spinner as a PIE against glibc (libc/: its loader and libc.so.6)
#   root/               the guest's binaries at their guest paths (/userspin, /bin/busybox,
#                       /userspin-dyn, its loader and libc):
#                       what `glass record --guest-root` takes
#   kallsyms, vmlinux.btf    the guest's /proc/kallsyms and /sys/kernel/btf/vmlinux,
#                       copied out of a boot with nokaslr (what --symbols takes)
#   kernel.version, kernel.config
# Installs the host packages it needs first (root). Idempotent: a step whose output is
# newer than its sources is skipped; `rm -rf KIT` for a clean build.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 KIT [x86_64|aarch64]..." >&2; exit 2; }
mkdir -p "$1"
KIT="$(cd "$1" && pwd)"
shift
ARCHES=("$@")
[ ${#ARCHES[@]} -gt 0 ] || ARCHES=(x86_64 aarch64)
log() { echo "linux-kit: $*" >&2; }
# shellcheck source=../../scripts/kit-lib.sh
. "$HERE/../../scripts/kit-lib.sh"
need_debs --no-install-recommends qemu-system-x86 qemu-system-arm busybox-static gcc \
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross kmod cpio gzip binutils

for arch in "${ARCHES[@]}"; do
    case "$arch" in
        x86_64) deb=amd64 cc=gcc nm=nm mods=(virtio_pci virtio_blk)
            libdir=/lib/x86_64-linux-gnu ldso=ld-linux-x86-64.so.2 interp=/lib64/ld-linux-x86-64.so.2
            hostlib=/lib/x86_64-linux-gnu ;;
        aarch64) deb=arm64 cc=aarch64-linux-gnu-gcc nm=aarch64-linux-gnu-nm mods=(virtio_mmio virtio_blk)
            libdir=/lib/aarch64-linux-gnu ldso=ld-linux-aarch64.so.1 interp=/lib/ld-linux-aarch64.so.1
            hostlib=/usr/aarch64-linux-gnu/lib ;;
        *) echo "kit.sh: no such architecture: $arch (x86_64 or aarch64)" >&2; exit 2 ;;
    esac
    out="$KIT/$arch"
    mkdir -p "$out"
    "$HERE/../../scripts/debian-kernel" "$deb" "$out" "${mods[@]}"
    fresh "$out/kernel" "$out/vmlinuz" || cp "$out/vmlinuz" "$out/kernel"

    # busybox-static of the guest's architecture (the host's own on x86_64)
    if [ "$deb" = "$(dpkg --print-architecture)" ]; then
        fresh "$out/busybox" /bin/busybox || cp /bin/busybox "$out/busybox"
    elif [ ! -s "$out/busybox" ]; then
        w="$out/.busybox-work"
        rm -rf "$w"
        mkdir -p "$w/x"
        chmod 777 "$w"
        (cd "$w" && apt-get download -q "busybox-static:$deb") >/dev/null
        dpkg-deb -x "$w"/*.deb "$w/x"
        cp "$w/x/bin/busybox" "$out/busybox"
        rm -rf "$w"
    fi

    if ! fresh "$out/userspin" "$HERE/spin.c"; then
        log "$arch userspin"
        "$cc" -static -nostdlib -ffreestanding -fno-pie -no-pie -O2 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls \
            -Wall -o "$out/userspin.tmp" "$HERE/spin.c"
        mv "$out/userspin.tmp" "$out/userspin"
        "$nm" -n "$out/userspin" >"$out/userspin.syms"
    fi

    # userspin-dyn: the same spinner as a PIE against glibc (its loader and libc.so.6
    # shipped in the initramfs at their guest paths), for shared libraries' unwinding.
    if ! fresh "$out/userspin-dyn" "$HERE/spin.c"; then
        log "$arch userspin-dyn"
        "$cc" -DUSERSPIN_LIBC -fpie -pie -O2 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls \
            -Wall -o "$out/userspin-dyn.tmp" "$HERE/spin.c"
        mv "$out/userspin-dyn.tmp" "$out/userspin-dyn"
    fi
    # The files userspin-dyn needs, laid out as in the guest (lib/, lib64/).
    if ! fresh "$out/libc$libdir/libc.so.6" "$hostlib/libc.so.6"; then
        rm -rf "$out/libc"
        mkdir -p "$out/libc$libdir" "$out/libc$(dirname "$interp")"
        cp -L "$hostlib/libc.so.6" "$hostlib/$ldso" "$out/libc$libdir/"
        [ "$interp" = "$libdir/$ldso" ] || ln -sf "$libdir/$ldso" "$out/libc$interp"
    fi

    if ! fresh "$out/initramfs.cpio.gz" "$HERE/init" "$out/userspin" "$out/userspin-dyn" "$out/busybox" "$out/modules/load.order"; then
        log "$arch initramfs.cpio.gz"
        st="$out/.initramfs"
        rm -rf "$st"
        mkdir -p "$st"/{bin,dev,proc,sys,tmp,lib/modules}
        cp "$out/busybox" "$st/bin/busybox"
        ln -s busybox "$st/bin/sh"
        cp "$HERE/init" "$st/init"
        cp "$out/userspin" "$st/userspin"
        cp "$out/userspin-dyn" "$st/userspin-dyn"
        cp -a "$out/libc/." "$st/"
        chmod 755 "$st/init" "$st/userspin" "$st/userspin-dyn"
        cp "$out"/modules/* "$st/lib/modules/"
        mknod -m 600 "$st/dev/console" c 5 1
        mkcpio "$st" "$out/initramfs.cpio.gz"
        rm -rf "$st"
    fi

    # The guest's filesystem as far as its binaries go, for --guest-root.
    if ! fresh "$out/root/userspin" "$out/userspin" || ! fresh "$out/root/bin/busybox" "$out/busybox" ||
        ! fresh "$out/root/userspin-dyn" "$out/userspin-dyn"; then
        rm -rf "$out/root"
        mkdir -p "$out/root/bin"
        cp "$out/userspin" "$out/userspin-dyn" "$out/root/"
        cp "$out/busybox" "$out/root/bin/busybox"
        cp -a "$out/libc/." "$out/root/"
    fi

    # The guest's own symbol table and BTF, from a boot with nokaslr and no workload.
    if ! fresh "$out/kallsyms" "$out/initramfs.cpio.gz" "$out/kernel"; then
        log "$arch: booting once for kallsyms and BTF"
        boot="$out/.boot"
        rm -rf "$boot"
        timeout 300 "$HERE/run.sh" --work 0 --smp 1 "$arch" "$KIT" "$boot" ||
            { log "$arch boot failed: $(tail -n 20 "$boot/serial.log" 2>/dev/null)"; exit 1; }
        [ -s "$boot/kallsyms" ] || { log "$arch: no kallsyms from the boot (see $boot/serial.log)"; exit 1; }
        mv "$boot/vmlinux.btf" "$out/vmlinux.btf"
        mv "$boot/kallsyms" "$out/kallsyms"
        rm -rf "$boot"
    fi
    log "$arch ready: $out ($(cat "$out/kernel.version"); $(grep -c . "$out/kallsyms") kallsyms lines, $(grep -c '\[' "$out/kallsyms") in modules)"
done
