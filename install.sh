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
# As root the install is for every user: when root's python3 lies under a directory others cannot enter (pyenv's
# /root/.pyenv under a 0700 /root), the venv is made with the distribution's /usr/bin/python3, and install.sh says so;
# where there is none (or PYTHON= names the private one), it says in one line that only root can run gpudoctor.
# The manual page (gpudoctor manpage) goes to GPUDOCTOR_MAN (default: share/man/man1 beside GPUDOCTOR_BIN's
# parent: /usr/local/share/man/man1 as root, ~/.local/share/man/man1 otherwise); the checkout's commit is recorded
# for `gpudoctor --version`.
# environment: PYTHON (default python3), GPUDOCTOR_HOME (the venv), GPUDOCTOR_BIN (where the command is linked),
#              GPUDOCTOR_MAN (where the manual page goes)
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
# every extra named must be one pyproject.toml defines: a typo would install without it, silently
known=$(sed -n '/^\[project.optional-dependencies\]/,/^\[/s/^\([A-Za-z0-9_-]*\) *=.*/\1/p' "$src/pyproject.toml" | tr '\n' ' ')
for x in $(printf '%s' "$extras" | tr ',' ' '); do
  case " $known" in *" $x "*) ;; *) die "--extras: unknown extra '$x' (valid: $(printf '%s' "${known% }" | tr ' ' ','))";; esac
done
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || die "--wheels $wheels: no such directory"
  wheels=$(cd "$wheels" && pwd)
fi

py=${PYTHON:-python3}
command -v "$py" >/dev/null 2>&1 || die "$py: not found (Debian/Ubuntu, as root: apt-get update && apt-get install python3; or set PYTHON=)"

# closed PYTHON: the directory on the way to PYTHON's real interpreter that users other than root cannot enter
# (or the interpreter they cannot execute); empty when every user can run it
closed() {
  "$1" -I -c 'import os, stat, sys
def shut(p):
    bad = "" if os.stat(p).st_mode & stat.S_IXOTH else p
    while p != os.path.dirname(p):
        p = os.path.dirname(p)
        bad = bad if os.stat(p).st_mode & stat.S_IXOTH else p
    return bad
exe = os.path.abspath(getattr(sys, "_base_executable", None) or sys.executable)  # what a venv links to
print(shut(exe) or shut(os.path.realpath(exe)))' 2>/dev/null || true
}
if [ "$(id -u)" = 0 ]; then  # root's install is for every user: its interpreter must be one they can run
  shut=$(closed "$py")
  if [ -n "$shut" ]; then
    if [ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3 ] && [ -z "$(closed /usr/bin/python3)" ] \
        && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      say "$py lies under $shut, which other users cannot enter: the venv uses /usr/bin/python3, so every user can run gpudoctor"
      py=/usr/bin/python3
    else
      say "note: $py lies under $shut, which other users cannot enter: $bin/gpudoctor will run for root only (set PYTHON= to a python3 every user can run)"
    fi
  fi
fi
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
elif [ "$(id -u)" = 0 ]; then
  shut=$(closed "$home/bin/python")
  [ -z "$shut" ] || say "note: the venv $home runs a python under $shut, which other users cannot enter: remove $home and run install.sh again so that every user can run gpudoctor"
fi

spec=$src
[ -z "$extras" ] || spec="$src[$extras]"
say "pip install $spec into $home${wheels:+ (offline, wheels from $wheels)}"
offline=''
[ -z "$wheels" ] || offline="--no-index --find-links"
# pip builds in the source tree (build/, gpudoctor.egg-info): build a copy in a temp dir, so that a checkout this user
# cannot write installs all the same and nothing is left in it
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpudoctor-build.XXXXXX" 2>/dev/null) \
  || { [ -z "$fresh" ] || rm -rf "$home"; die "cannot make a temporary build directory in ${TMPDIR:-/tmp} (set TMPDIR to a writable directory)"; }
if ! err=$("$home/bin/python" -c '
import shutil, sys
try:
    shutil.copytree(sys.argv[1], sys.argv[2], symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".venv", "venv"))
except (OSError, shutil.Error) as exc:
    e = exc.args[0][0] if isinstance(exc, shutil.Error) else exc
    sys.exit(str(e[2] if isinstance(e, tuple) else e))
' "$src" "$tmp/src" 2>&1); then
  rm -rf "$tmp"; [ -z "$fresh" ] || rm -rf "$home"
  die "cannot read the checkout $src to build it: $(printf '%s' "$err" | tail -n 1)"
fi
spec=$tmp/src
[ -z "$extras" ] || spec="$tmp/src[$extras]"
# $offline unquoted on purpose: empty, or two words followed by the (quoted) directory; "$@" holds --run's arguments
if ! (cd "$tmp" && "$home/bin/python" -m pip --disable-pip-version-check install -q $offline ${wheels:+"$wheels"} "$spec"); then
  rm -rf "$tmp"; [ -z "$fresh" ] || rm -rf "$home"
  die "pip install failed (above); nothing was linked"
fi
rm -rf "$tmp"

# the commit `gpudoctor --version` names (gpudoctor/buildinfo.py); none from a directory that is not a git checkout
commit=''
if command -v git >/dev/null 2>&1; then commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || true); fi
case $commit in ''|*[!0-9a-f]*) rm -f "$home/gpudoctor-commit";; *) printf '%s\n' "$commit" > "$home/gpudoctor-commit";; esac

mkdir -p "$bin"
if [ -e "$bin/gpudoctor" ] && [ ! -L "$bin/gpudoctor" ]; then
  say "replacing $bin/gpudoctor (an earlier install) with a link to $home/bin/gpudoctor"
fi
ln -sfn "$home/bin/gpudoctor" "$bin/gpudoctor.new.$$" && mv -f "$bin/gpudoctor.new.$$" "$bin/gpudoctor"
version=$("$bin/gpudoctor" --version 2>/dev/null || true)
# the manual page, from the commands' own help (quietly none where gpudoctor cannot run yet)
man=${GPUDOCTOR_MAN:-$(dirname "$bin")/share/man/man1}  # beside the command: /usr/local/share/man, ~/.local/share/man
if mkdir -p "$man" 2>/dev/null && "$bin/gpudoctor" manpage > "$man/.gpudoctor.1.$$" 2>/dev/null; then
  mv -f "$man/.gpudoctor.1.$$" "$man/gpudoctor.1"
else
  rm -f "$man/.gpudoctor.1.$$"
fi
say "installed ${version:-gpudoctor}: $bin/gpudoctor -> $home/bin/gpudoctor"
case $(readlink -f "$home")/ in /tmp/*|/var/tmp/*)  # systemd/*.service: PrivateTmp=yes hides it (status=203/EXEC)
  say "note: $home lies under /tmp or /var/tmp, which the systemd units hide (PrivateTmp=yes): they cannot start this gpudoctor; install elsewhere for them (GPUDOCTOR_HOME=/opt/gpudoctor)";;
esac
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
