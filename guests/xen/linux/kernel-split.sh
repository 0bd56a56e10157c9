#!/bin/busybox sh
# The kernel/user workload of a Linux domU (the init runs it when the kernel command line
# says glass_work=kernel): first the line of its /proc/kallsyms that places the kernel
# (`_text`), which dom0 checks against the Linux kit's table of the same kernel, taken
# from a nokaslr boot under QEMU (a PVH-booted kernel has no KASLR, so that table holds
# while it runs); then two processes whose kernel/user split the kernel itself accounts:
#   dd   busybox dd from /dev/zero to /dev/null in 64 KiB blocks (nearly all kernel time:
#        read_iter_zero clearing the user buffer)
#   spin a busybox shell loop of builtins (no system call: user time only)
# Every 2 s: `ksplit dd=U/S spin=U/S` (each process's utime/stime in clock ticks from
# /proc/PID/stat, cumulative), read with shell builtins only, so that nothing else runs
# in the domU to speak of.
bb=/bin/busybox
# awk stops at _text, some 400 lines in: the kernel lists /proc/kallsyms as it is read.
# (The whole table sent through the console, gzipped, took about 20 s of a nested-TCG run:
# the console carried ~45 KiB/s.)
echo "kallsyms $($bb awk '$3 == "_text" { print; exit }' /proc/kallsyms)"
$bb dd if=/dev/zero of=/dev/null bs=65536 2>/dev/null &
dd=$!
$bb sh -c 'while :; do :; done' &
spin=$!
echo "ksplit: dd is pid $dd, spin is pid $spin"
ticks() {
    read -r stat <"/proc/$1/stat"
    set -- $stat
    u=${14} s=${15}
}
while :; do
    $bb sleep 2
    ticks "$dd"
    d="$u/$s"
    ticks "$spin"
    echo "ksplit dd=$d spin=$u/$s"
done
