#!/bin/busybox sh
# The kernel/user workload of a Linux domU (the init runs it when the kernel command line
# says glass_work=kernel): the text symbols of its /proc/kallsyms out through the console
# first, with the few data symbols that place the kernel's ORC tables and IRQ stacks (what
# dom0 gives glass as --symbols; a PVH-booted kernel has no KASLR, so the table holds
# while it runs), then two processes whose kernel/user split the kernel itself accounts:
#   dd   busybox dd from /dev/zero to /dev/null in 64 KiB blocks (nearly all kernel time:
#        read_iter_zero clearing the user buffer)
#   spin a busybox shell loop of builtins (no system call: user time only)
# Every 2 s: `ksplit dd=U/S spin=U/S` (each process's utime/stime in clock ticks from
# /proc/PID/stat, cumulative), read with shell builtins only, so that nothing else runs
# in the domU to speak of.
bb=/bin/busybox
# Gzipped and base64-encoded between two marker lines: the console carried ~45 KiB/s
# under nested TCG here, and Debian's kernel has ~50 000 text symbols (2 MiB of text,
# 0.6 MiB sent; the whole table took twice as long).
echo "kallsyms-begin"
$bb awk '$2 ~ /^[tTwW]$/ || $3 ~ /^(__start_orc_unwind|__start_orc_unwind_ip|__stop_orc_unwind_ip|hardirq_stack_ptr)$/' /proc/kallsyms |
    $bb gzip -9 | $bb base64
echo "kallsyms-end"
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
