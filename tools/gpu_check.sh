#!/usr/bin/env bash
# kvctl on a GPU, in one call (issue 25): the facts kvctl's GPU paths rest on, checked against a real
# GPU. Made for a lent single-GPU machine with PyTorch and CUDA but no vLLM and no network; it runs on
# any Linux (each GPU part then says no-gpu) and exits 0 whenever it could run: the parts' results
# are data. docs/gpu-check.md says how to run it on the lent machine and what each part shows.
#
#   bash tools/gpu_check.sh [--wheels DIR] [--out DIR] [--python PY] [--quick] [--budget SECONDS]
#
#   --wheels DIR  what tools/gpu_check_prepare.sh filled: Mooncake's CUDA 13 wheel (one per Python
#                 tag), py/ (wheels the discovery check may need) and debs/ (system libraries)
#   --out DIR     gpu-check.txt (this output), gpu-check.json (every part), gpu-check-logs.tar.gz (raw
#                 logs); default $OUT when set (what comes back from the lent machine), else ./gpu-check-out
#   --python PY   the interpreter with torch (default python3)
#   --quick       small sizes, and no CPU-only runs when there is no GPU (the unit test's mode)
#   --budget S    seconds for all parts together (default 480: a call of 540 s keeps a minute spare)
#
# Parts, each under its own `timeout`, each a section here and a record in gpu-check.json:
#   a machine    nvidia-smi, Python/torch/CUDA, the CUDA variables, ulimit -l, free -g, the CUDA
#                runtime distributions and kvctl's Mooncake wheel choice (tools/gpu/machine_facts.py)
#   b discovery  kvctl/serve/gpus.py against torch's own enumeration (tools/gpu/discovery_check.py)
#   d mooncake   Mooncake's CUDA 13 wheel: mooncake_master on 127.0.0.1, then put/get from and into
#                CUDA tensors (tools/gpu/mooncake_cuda_putget.py); the master is stopped at the end
#   c bf16       the bf16 prefix-cache log-probability difference, cuda (and cpu --quick beside it)
#                (tools/gpu/bf16_prefix_logprobs.py); run last: it takes the longest
set -uo pipefail  # no -e: a part that fails is a result, never the end of the run

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheels='' out=${OUT:-./gpu-check-out} python=python3 quick=0 budget=480

usage() { sed -n '7,15p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check.sh: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }
while (($#)); do
    case $1 in
        --wheels) need "$@"; wheels=$2; shift 2 ;;
        --out) need "$@"; out=$2; shift 2 ;;
        --python) need "$@"; python=$2; shift 2 ;;
        --budget) need "$@"; budget=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ $budget =~ ^[0-9]+$ ]] || die "--budget '$budget' is not a number of seconds"
if [[ -n $wheels ]]; then
    [[ -d $wheels ]] || die "--wheels $wheels: no such folder (fill it here with tools/gpu_check_prepare.sh)"
    wheels=$(cd "$wheels" && pwd)
fi
command -v "$python" >/dev/null || die "--python $python: not found"
mkdir -p "$out" || die "--out $out: cannot create it"
out=$(cd "$out" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")  # logs and part records (packed into the tarball)
inst=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")  # installed wheels and libraries (not packed)
master_pid=''
pypath=$repo${PYTHONPATH:+:$PYTHONPATH}
ldpath=${LD_LIBRARY_PATH:-}
cuda_state=''
t0=$SECONDS
rule=$(printf '=%.0s' {1..100})

stop_master() {
    [[ -n $master_pid ]] || return 0
    kill -TERM "$master_pid" 2>/dev/null
    local _
    for _ in {1..50}; do kill -0 "$master_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$master_pid" 2>/dev/null
    wait "$master_pid" 2>/dev/null
    echo "mooncake_master (pid $master_pid) stopped"
    master_pid=''
}
cleanup() {
    stop_master
    tar -czf "$out/gpu-check-logs.tar.gz" -C "$work" . 2>/dev/null
    rm -rf "$work" "$inst"
}
trap cleanup EXIT
trap 'echo "gpu_check.sh: interrupted"; exit 130' INT
trap 'echo "gpu_check.sh: terminated"; exit 143' TERM
exec > >(tee "$out/gpu-check.txt") 2>&1

report() { "$python" "$repo/tools/gpu/report.py" "$1" --work "$work" "${@:2}"; }
left() { echo $((budget - (SECONDS - t0))); }
cap() {  # a part's timeout: what it asks for, cut to what the budget has left (never below 5 s)
    local want=$1 rest
    rest=$(($(left) - 10))
    ((rest < want)) && want=$rest
    ((want < 5)) && want=5
    echo "$want"
}

shell_cmd() {  # $1 part, $2 label, then the command (20 s at most); printed and kept in the part's record
    local part=$1 label=$2 file=$work/cmd.txt rc
    shift 2
    echo "\$ $label"
    if command -v "$1" >/dev/null; then
        timeout -k 2 20 "$@" >"$file" 2>&1
        rc=$?
    else
        echo "$1: not found on PATH" >"$file"
        rc=127
    fi
    cat "$file"
    ((rc == 0)) || echo "(exit $rc)"
    report cmd --part "$part" --label "$label" --rc "$rc" --output "$file"
}

torch_cuda() {  # "yes", or why there is no GPU for torch (asked once)
    if [[ -z $cuda_state ]]; then
        cuda_state=$(timeout -k 5 90 "$python" -c 'import torch
print("yes" if torch.cuda.is_available() else
      f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False)")' 2>/dev/null) ||
            cuda_state="torch is not installed for $python"
    fi
    echo "$cuda_state"
}

pip_install() {  # $1 target folder, $2 wheel: pip when it works, else unpack it (a wheel is a zip)
    "$python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
        --target "$1" "$2" && return 0
    echo "pip could not install $2: unpacking it with zipfile instead"
    "$python" -m zipfile -e "$2" "$1"
}

provide_py_deps() {  # the carried wheels of distributions this Python lacks, into a folder on PYTHONPATH
    [[ -n $wheels && -d $wheels/py ]] || return 0
    local whl dist
    for whl in "$wheels"/py/*.whl; do
        [[ -e $whl ]] || continue
        dist=$(basename "$whl")
        dist=${dist%%-*}
        if "$python" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$dist" 2>/dev/null; then
            echo "$dist: installed already"
        elif pip_install "$inst/py-site" "$whl"; then
            echo "$dist: installed from $(basename "$whl")"
        fi
    done
    [[ -d $inst/py-site && :$pypath: != *":$inst/py-site:"* ]] && pypath=$pypath:$inst/py-site
    return 0
}

extract_deb() {  # $1 .deb, $2 folder: dpkg-deb, else Python reads the ar archive and its data.tar.xz
    command -v dpkg-deb >/dev/null && { dpkg-deb -x "$1" "$2"; return; }
    "$python" - "$1" "$2" <<'EOF'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not a .deb"
pos = 8
while pos + 60 <= len(data):
    name, size = data[pos:pos + 16].decode().strip().rstrip("/"), int(data[pos + 48:pos + 58].decode())
    pos += 60
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(data[pos:pos + size])).extractall(sys.argv[2])
    pos += size + size % 2
EOF
}

provide_system_libs() {  # binaries...: unpack the carried .debs of the libraries the loader cannot find
    local round missing soname deb progress sysroot=$inst/sysroot
    for round in 1 2 3 4 5; do
        missing=$(LD_LIBRARY_PATH=$ldpath ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 == "not" {print $1}' | sort -u)
        [[ -z $missing ]] && { ((round > 1)) && echo "every library found now"; return 0; }
        echo "the loader cannot find: $(echo $missing)"
        progress=0
        for soname in $missing; do
            deb=$(awk -v s="$soname" '$1 == s {print $2; exit}' "$wheels/debs/index.txt" 2>/dev/null)
            [[ -n $deb && ! -e $sysroot/.done-$deb ]] || continue
            mkdir -p "$sysroot"
            extract_deb "$wheels/debs/$deb" "$sysroot" && touch "$sysroot/.done-$deb" && progress=1 &&
                echo "  $soname: unpacked $deb"
        done
        if ((!progress)); then
            echo "no carried .deb provides: $(echo $missing)"
            [[ $missing == *libcuda.so.1* ]] && echo "(libcuda.so.1 comes with the NVIDIA driver: this machine has none)"
            return 1
        fi
        [[ :$ldpath: == *":$sysroot/usr/lib/x86_64-linux-gnu:"* ]] ||
            ldpath=$sysroot/usr/lib/x86_64-linux-gnu:$sysroot/lib/x86_64-linux-gnu${ldpath:+:$ldpath}
    done
    return 1
}

start_master() {  # $1 executable: mooncake_master on loopback, flags as kvctl/serve/master_process.py passes them
    local ports
    ports=$("$python" -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])') || return 1
    read -r rpc_port metrics_port <<<"$ports"
    echo "\$ $1 --rpc_address=127.0.0.1 --rpc_port=$rpc_port --metrics_host=127.0.0.1 --metrics_port=$metrics_port --logtostderr"
    LD_LIBRARY_PATH=$ldpath "$1" --rpc_address=127.0.0.1 --rpc_port="$rpc_port" --metrics_host=127.0.0.1 \
        --metrics_port="$metrics_port" --logtostderr >"$work/mooncake_master.log" 2>&1 &
    master_pid=$!
    sleep 0.5
    kill -0 "$master_pid" 2>/dev/null && return 0
    wait "$master_pid"
    echo "mooncake_master exited at once (exit $?):"
    tail -n 20 "$work/mooncake_master.log"
    master_pid=''
    return 1
}

# -- the parts --------------------------------------------------------------------------------------
part_machine() {
    if command -v nvidia-smi >/dev/null; then
        shell_cmd machine "nvidia-smi -L" nvidia-smi -L
        shell_cmd machine "nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv" \
            nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv
        shell_cmd machine "nvidia-smi --query-gpu=driver_version,pci.bus_id,compute_mode --format=csv" \
            nvidia-smi --query-gpu=driver_version,pci.bus_id,compute_mode --format=csv
        shell_cmd machine "nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv" \
            nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv
    else
        shell_cmd machine "nvidia-smi -L" nvidia-smi -L
    fi
    shell_cmd machine "CUDA variables" bash -c 'for v in CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER NVIDIA_VISIBLE_DEVICES; do
        if [[ -v $v ]]; then echo "$v=${!v}"; else echo "$v unset"; fi; done'
    shell_cmd machine "ulimit -l" bash -c 'ulimit -l'
    shell_cmd machine "free -g" free -g
    shell_cmd machine "nproc; uname -a" bash -c 'nproc; uname -a'
    echo "\$ $python tools/gpu/machine_facts.py"
    timeout -k 5 "$(cap 90)" env PYTHONPATH="$pypath" "$python" "$repo/tools/gpu/machine_facts.py" \
        --json "$work/machine.json"
    local rc=$?
    command -v nvidia-smi >/dev/null || report update --part machine --append "nvidia-smi not on PATH"
    return "$rc"
}

part_discovery() {
    provide_py_deps
    echo "\$ $python tools/gpu/discovery_check.py --python $python"
    timeout -k 5 "$(cap 120)" env PYTHONPATH="$pypath" "$python" "$repo/tools/gpu/discovery_check.py" \
        --python "$python" --json "$work/discovery.json"
}

mooncake_from_wheels() {  # sets site and master from the carried wheel for this Python; else says why not
    local tag whl have
    tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    whl=$(ls "$wheels"/mooncake_transfer_engine_cuda13-*-"$tag"-"$tag"-*.whl 2>/dev/null | head -n 1)
    if [[ -z $whl ]]; then
        have=$(cd "$wheels" && ls mooncake_transfer_engine_cuda13-*.whl 2>/dev/null | sed -E 's/.*-(cp[0-9]+)-cp[0-9]+-.*/\1/' |
            paste -sd, -)
        report update --part mooncake --status skipped --summary "no Mooncake CUDA 13 wheel for this Python \
($tag) in $wheels (it holds: ${have:-none}): run GPU_CHECK_PYTHONS=${tag:2:1}.${tag:3} tools/gpu_check_prepare.sh"
        return 1
    fi
    echo "installing $(basename "$whl") into $inst/mooncake-site"
    pip_install "$inst/mooncake-site" "$whl" || {
        report update --part mooncake --status failed --summary "could not install $(basename "$whl")"
        return 1
    }
    site=$inst/mooncake-site
    master=$site/mooncake/mooncake_master
    report update --part mooncake --set "wheel=$(basename "$whl")"
}

mooncake_installed() {  # sets master from the mooncake this Python already has (e.g. kvctl's .venv here)
    master=$("$python" -c 'import importlib.util, os
spec = importlib.util.find_spec("mooncake")
print(os.path.join(list(spec.submodule_search_locations)[0], "mooncake_master"))' 2>/dev/null)
    if [[ ! -x $master ]]; then
        report update --part mooncake --status skipped --summary "no --wheels folder, and no mooncake installed for \
$python: carry the CUDA 13 wheel (tools/gpu_check_prepare.sh, then --wheels .gpu-check-wheels)"
        return 1
    fi
    report update --part mooncake --set "wheel=installed for $python (no --wheels)"
}

cudart_dirs() {  # the folders of the libcudart.so.* torch's nvidia packages carry (the wheel bundles none)
    "$python" - <<'EOF' 2>/dev/null
import os, sys
from pathlib import Path
dirs = {str(p.parent) for e in sys.path if os.path.isdir(e) for p in Path(e).glob("nvidia/**/libcudart.so*")}
print(":".join(sorted(dirs)))
EOF
}

part_mooncake() {
    local state site='' master='' devices rc
    state=$(torch_cuda)
    if [[ $state != yes ]] && ((quick)); then
        report update --part mooncake --status no-gpu --summary "no GPU ($state); --quick: no CPU baseline run"
        return 0
    fi
    devices=(--device cpu --device cuda)  # without a GPU the cuda variants say no-gpu themselves
    if [[ -n $wheels ]]; then mooncake_from_wheels || return 0; else mooncake_installed || return 0; fi
    local extra
    extra=$(cudart_dirs)
    [[ -n $extra ]] && ldpath=$extra${ldpath:+:$ldpath}
    local libs=("$master")
    [[ -n $site ]] && libs+=("$site"/mooncake/_store*.so "$site"/mooncake/engine.so)
    if ! provide_system_libs "${libs[@]}"; then
        echo "(going on: the master or the client will say what is missing)"
    fi
    if ! start_master "$master"; then
        report update --part mooncake --status failed --summary "mooncake_master did not start: $(tail -n 3 \
"$work/mooncake_master.log" | tr '\n' ' ')"
        return 0
    fi
    local args=(--master "127.0.0.1:$rpc_port" --metrics-url "http://127.0.0.1:$metrics_port" "${devices[@]}"
        --json "$work/mooncake.json" --workdir "$work/mooncake" --variant-timeout $((quick ? 30 : 45)))
    ((quick)) && args+=(--quick)
    echo "\$ $python tools/gpu/mooncake_cuda_putget.py ${args[*]}"
    timeout -k 5 "$(cap 220)" env PYTHONPATH="$pypath${site:+:$site}" LD_LIBRARY_PATH="$ldpath" \
        "$python" "$repo/tools/gpu/mooncake_cuda_putget.py" "${args[@]}"
    rc=$?
    kill -0 "$master_pid" 2>/dev/null || report update --part mooncake --append "the master died during the run"
    # without a GPU the CUDA question stays open, whatever the CPU variants found (the CUDA build does
    # not even import without the driver's libcuda.so.1)
    [[ $state == yes ]] || report update --part mooncake --status no-gpu --prefix "no GPU ($state)"
    echo "--- mooncake_master log (last 15 lines)"
    tail -n 15 "$work/mooncake_master.log" | cut -c1-300
    stop_master
    report update --part mooncake --set "master=$master" --set "LD_LIBRARY_PATH=$ldpath"
    return "$rc"
}

part_bf16() {
    local script=$repo/tools/gpu/bf16_prefix_logprobs.py state runs=() no_gpu=() rc
    if [[ ! -f $script ]]; then
        report update --part bf16 --status missing --summary "tools/gpu/bf16_prefix_logprobs.py is not in this checkout"
        return 0
    fi
    bf16_run() {  # $1 device, $2 timeout, then the script's flags
        local device=$1 limit=$2
        shift 2
        echo "\$ $python tools/gpu/bf16_prefix_logprobs.py $* --json   (at most $limit s)"
        timeout -k 5 "$limit" "$python" "$script" "$@" --json >"$work/bf16-$device.json" 2>"$work/bf16-$device.err"
        rc=$?
        tail -n 20 "$work/bf16-$device.err"
        ((rc == 0)) || echo "(exit $rc)"
        runs+=(--run "$device:$rc")
    }
    state=$(torch_cuda)
    if [[ $state == yes ]]; then
        bf16_run cuda "$(cap 180)" --device cuda
        ((quick)) || bf16_run cpu "$(cap 90)" --device cpu --quick
    else
        no_gpu=(--no-gpu "$state")
        [[ $state == torch* && $state != *"not installed"* ]] && ((!quick)) && bf16_run cpu "$(cap 90)" --device cpu --quick
    fi
    report bf16 "${runs[@]}" "${no_gpu[@]}"
}

run_part() {  # $1 name, $2 title, $3 function
    local name=$1 title=$2 began=$SECONDS rc=0
    printf '\n%s\n=== %s   (%s s of the budget left)\n%s\n' "$rule" "$title" "$(left)" "$rule"
    if (($(left) < 20)); then
        report update --part "$name" --status skipped --summary "out of time: the budget of $budget s is spent"
    else
        "$3"
        rc=$?
    fi
    report finish --part "$name" --title "$title" --rc "$rc" --seconds $((SECONDS - began))
    summary --quiet  # gpu-check.json after every part: a call cut short still brings back the parts done
}
summary() {
    report summary --out "$out" "$@" --meta "commit=$commit" "quick=$quick" "python=$python" \
        "seconds=$((SECONDS - t0))" "budget=$budget" "wheels=${wheels:-none}"
}

# -- the run ----------------------------------------------------------------------------------------
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "gpu_check.sh: kvctl $commit on $(hostname) at $(date -u +%FT%TZ); python $python; budget $budget s;" \
    "quick $quick; wheels ${wheels:-none}; results in $out"
[[ -n $wheels ]] && (cd "$wheels" && ls -l *.whl py/ debs/ 2>/dev/null | grep -v '^total' | awk '{print "  " $5, $NF}')
run_part machine "a. machine facts" part_machine
run_part discovery "b. kvctl GPU discovery" part_discovery
run_part mooncake "d. Mooncake on the GPU" part_mooncake
run_part bf16 "c. bf16 prefix logprobs" part_bf16
summary
exit 0
