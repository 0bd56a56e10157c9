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
