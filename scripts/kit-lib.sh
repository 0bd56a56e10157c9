# Sourced by the guest kits' kit.sh (guests/linux, guests/xen, guests/xen-arm64): the pieces
# they share. Needs `log` defined by the kit.

# fresh OUTPUT SOURCE...: OUTPUT exists and is newer than every SOURCE
fresh() {
    local o="$1" s
    shift
    [ -e "$o" ] || return 1
    for s in "$@"; do [ "$s" -nt "$o" ] && return 1; done
    return 0
}

# need_debs [APT-OPTION...] PACKAGE...: installs the host packages not installed yet
need_debs() {
    local p options=() missing=()
    for p in "$@"; do
        case "$p" in
            -*) options+=("$p") ;;
            *) dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p") ;;
        esac
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    log "installing ${missing[*]}"
    "$(dirname "${BASH_SOURCE[0]}")/apt-install" "${options[@]}" "${missing[@]}"
}

# mkcpio DIR OUT.cpio.gz: a newc archive of DIR, owned by root
mkcpio() {
    (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) |
        gzip -6 >"$2.tmp"
    mv "$2.tmp" "$2"
}
