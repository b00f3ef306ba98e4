#!/bin/sh
# Install gpudoctor from this checkout into its own virtual environment and put the `gpudoctor` command on PATH.
#
#   root:          venv /opt/gpudoctor, command /usr/local/bin/gpudoctor (the path the systemd units run)
#   another user:  venv ${XDG_DATA_HOME:-~/.local/share}/gpudoctor, command ~/.local/bin/gpudoctor
#
# The distribution's python3 stays untouched (PEP 668: Debian 12 / Proxmox VE 8 / Ubuntu refuse a bare pip install).
# Where `python3 -m venv` does not work (Debian/Ubuntu without python3-venv) and we are root with apt, python3-venv
# is installed first. Run it again to upgrade: the same venv is reused. docs/install.md explains the routes.
#
# usage: ./install.sh [--extras LIST] [--wheels DIR] [--where] [--help] [--run GPUDOCTOR-ARGS...]
#   --extras LIST  also install these extras of the package (comma-separated: test, plots, tokenizers)
#   --wheels DIR   offline: install only from the wheels in DIR (pip --no-index --find-links DIR)
#   --where        print the venv directory this install uses and exit
#   --run ARGS...  then run THIS install's gpudoctor with the rest of the line (`--run check`: README line 1), by its
#                  full path: it works before ~/.local/bin is on PATH, and never runs another install's gpudoctor
# When `gpudoctor` in the calling shell is not this install's (not on PATH yet, or root's /usr/local/bin/gpudoctor
# found first), install.sh says so in one line.
# environment: PYTHON (default python3), GPUDOCTOR_HOME (the venv), GPUDOCTOR_BIN (where the command is linked)
set -eu

say() { printf 'install.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 3; }

extras='' wheels=''
while [ $# -gt 0 ]; do
  case $1 in
    --extras) [ $# -ge 2 ] || die "--extras needs a value (e.g. --extras test)"; extras=$2; shift 2;;
    --extras=*) extras=${1#--extras=}; shift;;
    --wheels) [ $# -ge 2 ] || die "--wheels needs a directory"; wheels=$2; shift 2;;
    --wheels=*) wheels=${1#--wheels=}; shift;;
    --where) where=1; shift;;
    --run) shift; [ $# -ge 1 ] || die "--run needs a gpudoctor command (e.g. --run check)"; run=1; break;;
    -h|--help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) die "unknown option '$1' (see ./install.sh --help)";;
  esac
done
case $extras in *[!A-Za-z0-9_,-]*) die "--extras '$extras': only comma-separated extra names (test,plots)";; esac

if [ "$(id -u)" = 0 ]; then
  home=${GPUDOCTOR_HOME:-/opt/gpudoctor} bin=${GPUDOCTOR_BIN:-/usr/local/bin}
else
  [ -n "${HOME:-}" ] || die "HOME is not set: set GPUDOCTOR_HOME and GPUDOCTOR_BIN"
  home=${GPUDOCTOR_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/gpudoctor} bin=${GPUDOCTOR_BIN:-$HOME/.local/bin}
fi
[ -z "${where:-}" ] || { printf '%s\n' "$home"; exit 0; }

src=$(cd "$(dirname "$0")" && pwd)
[ -f "$src/pyproject.toml" ] || die "$src/pyproject.toml: not found (run install.sh from a gpudoctor checkout)"
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || die "--wheels $wheels: no such directory"
  wheels=$(cd "$wheels" && pwd)
fi

py=${PYTHON:-python3}
command -v "$py" >/dev/null 2>&1 || die "$py: not found (Debian/Ubuntu, as root: apt-get update && apt-get install python3; or set PYTHON=)"
ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || die "$py does not run"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$py is Python $ver; gpudoctor needs Python >= 3.10"

fresh=''
if ! "$home/bin/python" -c 'import sys' >/dev/null 2>&1; then
  [ ! -e "$home" ] || [ -z "$(ls -A "$home" 2>/dev/null)" ] || [ -f "$home/pyvenv.cfg" ] \
    || die "$home exists and is not a virtual environment: move it away or set GPUDOCTOR_HOME"
  fresh=1
  mkdir -p "$(dirname "$home")"
  log=$(mktemp)
  if ! "$py" -m venv --clear "$home" >"$log" 2>&1; then
    rm -rf "$home"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "$py -m venv does not work here; installing python$ver-venv with apt-get"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "python$ver-venv" >/dev/null \
        || { rm -f "$log"; die "apt-get install python$ver-venv failed"; }
      "$py" -m venv "$home" >"$log" 2>&1 || { cat "$log" >&2; rm -rf "$home" "$log"; die "$py -m venv $home failed"; }
    else
      rm -f "$log"
      die "$py -m venv does not work here (Debian/Ubuntu: an administrator runs 'apt-get update && apt-get install python$ver-venv')"
    fi
  fi
  rm -f "$log"
fi

spec=$src
[ -z "$extras" ] || spec="$src[$extras]"
say "pip install $spec into $home${wheels:+ (offline, wheels from $wheels)}"
offline=''
[ -z "$wheels" ] || offline="--no-index --find-links"
# $offline unquoted on purpose: empty, or two words followed by the (quoted) directory; "$@" holds --run's arguments
if ! (cd "$src" && "$home/bin/python" -m pip --disable-pip-version-check install -q $offline ${wheels:+"$wheels"} "$spec"); then
  [ -z "$fresh" ] || rm -rf "$home"
  die "pip install failed (above); nothing was linked"
fi

mkdir -p "$bin"
if [ -e "$bin/gpudoctor" ] && [ ! -L "$bin/gpudoctor" ]; then
  say "replacing $bin/gpudoctor (an earlier install) with a link to $home/bin/gpudoctor"
fi
ln -sfn "$home/bin/gpudoctor" "$bin/gpudoctor.new.$$" && mv -f "$bin/gpudoctor.new.$$" "$bin/gpudoctor"
version=$("$bin/gpudoctor" --version 2>/dev/null || true)
say "installed ${version:-gpudoctor}: $bin/gpudoctor -> $home/bin/gpudoctor"
# What `gpudoctor` means in the calling shell: this install, nothing yet, or another install found first on PATH.
found=$(command -v gpudoctor 2>/dev/null || true)
mine=$(readlink -f "$bin/gpudoctor")
if [ -z "$found" ]; then
  say "$bin is not on your PATH yet: run $bin/gpudoctor, or log in again (Debian's ~/.profile adds ~/.local/bin once it exists)"
elif [ "$(readlink -f "$found")" != "$mine" ]; then
  other=$("$found" --version 2>/dev/null || true)
  say "note: \`gpudoctor\` in this shell is $found (another install${other:+: $other}), not this one: run $bin/gpudoctor, or put $bin first on PATH"
fi
if [ -n "${run:-}" ]; then
  [ -n "$found" ] && [ "$(readlink -f "$found")" = "$mine" ] || say "running this install's $bin/gpudoctor $*"
  exec "$bin/gpudoctor" "$@"
fi
