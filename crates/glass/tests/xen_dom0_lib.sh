# Shell helpers of the dom0 scripts of crates/glass/tests/xen.rs (sourced by xen_dom0.sh
# and xen_trace_dom0.sh): a guest's console, its split lines, its state.
console() { echo "/var/log/xen/console/guest-$1.log"; }
lines() { tr -d '\r' <"$(console "$1")" 2>/dev/null | grep -c '^split ' || true; }
state() { xl list "$1" 2>/dev/null | awk 'NR == 2 { print $5 }'; }

# Waits up to $2 s until domain $1 printed $3 more split lines than it had.
wait_lines() {
    local name=$1 limit=$(($(date +%s) + $2)) want=$(($(lines "$1") + $3))
    while [ "$(lines "$name")" -lt "$want" ]; do
        [ "$(date +%s)" -lt "$limit" ] || return 1
        sleep 0.2
    done
}

# Waits up to $1 s until no guardian of glass runs (each ends once it has put back what
# its dead glass left: unpaused the domain, restored the code; when it finds nothing to
# do it says nothing), in place of a fixed sleep after each kill. The bracket keeps grep
# from finding its own command line.
wait_guardian() {
    local limit=$(($(date +%s%N) / 1000000 + $1 * 1000))
    while grep -qsa -- '__guard[i]an' /proc/[0-9]*/cmdline; do
        [ "$(($(date +%s%N) / 1000000))" -lt "$limit" ] || return 1
        sleep 0.05
    done
}

# Waits up to $2 s until glass's stderr $1 says it is sampling (it prints its unwind
# tables just before the first pause).
wait_sampling() {
    local limit=$(($(date +%s) + $2))
    until grep -q 'unwind tables of' "$1" 2>/dev/null; do
        [ "$(date +%s)" -lt "$limit" ] || return 1
        sleep 0.1
    done
}
