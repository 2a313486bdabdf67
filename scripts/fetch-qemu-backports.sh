#!/usr/bin/env bash
# Unpack a newer QEMU beside the system's, for the tests that run isopod on
# it: on Debian 12, QEMU 10.0 from bookworm-backports (the QEMU of Debian
# 13), which boots microvm with SeaBIOS where 7.2 uses qboot.
#
#   ./scripts/fetch-qemu-backports.sh [DIR]    default /opt/isopod-qemu-backports
#
# The system's QEMU stays as it is: the packages are downloaded with a
# private apt configuration (the host's sources, lists and pins are not
# touched) from the Debian mirror the host's sources already name, and
# unpacked with dpkg -x into DIR. Those of the packages' dependencies that
# the host lacks or has too old (seabios) come along. The tests find the
# binary at DIR/usr/bin/qemu-system-x86_64 (or $ISOPOD_TEST_QEMU10); isopod
# runs it with ISOPOD_QEMU=that path and passes its data directories with
# -L. Idempotent: an unpacked DIR of the same versions is kept.
set -euo pipefail

dest="${1:-/opt/isopod-qemu-backports}"
want_major="${ISOPOD_QEMU_BACKPORTS_MAJOR:-10}"

. /etc/os-release
codename="${VERSION_CODENAME:-}"
if [ "${ID:-}" != debian ] || [ -z "$codename" ]; then
  echo "fetch-qemu-backports: this host is ${PRETTY_NAME:-unknown}, not Debian; nothing to fetch" >&2
  exit 2
fi
suite="${ISOPOD_QEMU_BACKPORTS_SUITE:-$codename-backports}"

# The mirror and keyring the host uses for its main suite: one-line
# sources.list entries, then deb822 .sources files.
mirror="" keyring=""
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -r "$f" ] || continue
  line=$(awk -v s="$codename" '$1=="deb" { for (i=2;i<=NF;i++) if ($i==s) { print; exit } }' "$f")
  if [ -n "$line" ]; then
    mirror=$(echo "$line" | grep -o 'https\?://[^ ]*' | head -n1)
    keyring=$(echo "$line" | sed -n 's/.*signed-by=\([^] ]*\).*/\1/p')
    break
  fi
done
if [ -z "$mirror" ]; then
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    # The first stanza whose Suites has the codename itself.
    read -r mirror keyring < <(awk -v s="$codename" '
      /^[[:space:]]*$/ { if (ok && uri != "") { print uri, key; exit } ok=0; uri=""; key="" ; next }
      /^URIs:/ { uri=$2 }
      /^Signed-By:/ { key=$2 }
      /^Suites:/ { for (i=2;i<=NF;i++) if ($i==s) ok=1 }
      END { if (ok && uri != "") print uri, key }' "$f") || true
    [ -n "$mirror" ] && break
  done
fi
if [ -z "$mirror" ]; then
  echo "fetch-qemu-backports: no apt source for $codename found in /etc/apt/sources.list*" >&2
  exit 1
fi
keyring="${keyring:-/usr/share/keyrings/debian-archive-keyring.gpg}"

work=$(mktemp -d /tmp/isopod-qemu-backports-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
# Only the backports suite's index (a few hundred kB); the host's main suite
# is added when a dependency is in neither the host's packages nor it.
sources() {
  : >"$work/sources.list"
  for s in "$@"; do
    echo "deb [signed-by=$keyring] $mirror $s main" >>"$work/sources.list"
  done
}
apt_opts=(-q -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1
  -o APT::Sandbox::User=root)
resolve() {
  apt-get "${apt_opts[@]}" update >/dev/null
  apt-get "${apt_opts[@]}" -s --no-install-recommends install "qemu-system-x86/$suite"
}
sources "$suite"
if ! plan=$(resolve 2>&1); then
  sources "$suite" "$codename"
  plan=$(resolve) || { echo "fetch-qemu-backports: apt cannot resolve qemu-system-x86 from $suite" >&2; exit 1; }
fi
# "Inst NAME [OLD] (VERSION Suite [arch])": what the host lacks, as
# NAME=VERSION.
pkgs=$(echo "$plan" | awk '$1=="Inst" { for (i=3;i<=NF;i++) if ($i ~ /^\(/) { v=$i; sub(/^\(/, "", v); print $2 "=" v; break } }')
version=$(echo "$pkgs" | sed -n 's/^qemu-system-x86=//p')
major=$(echo "$version" | sed -n 's/^\([0-9]*:\)\{0,1\}\([0-9]*\)\..*/\2/p')
if [ -z "$version" ] || [ "${major:-0}" -lt "$want_major" ]; then
  echo "fetch-qemu-backports: $suite offers qemu-system-x86 ${version:-none}, not $want_major or newer" >&2
  exit 1
fi
stamp="$dest/.isopod-packages"
if [ -x "$dest/usr/bin/qemu-system-x86_64" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pkgs" ]; then
  echo "fetch-qemu-backports: QEMU $version already unpacked in $dest" >&2
  echo "$dest/usr/bin/qemu-system-x86_64"
  exit 0
fi
echo "fetch-qemu-backports: downloading $(echo $pkgs) from $mirror $suite" >&2
# shellcheck disable=SC2086
(cd "$work/debs" && apt-get "${apt_opts[@]}" download $pkgs >/dev/null)
rm -rf "$dest.new"
mkdir -p "$dest.new"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$dest.new"; done
echo "$pkgs" >"$dest.new/.isopod-packages"
# The jailed VMM's uid reads the firmware and runs the binary.
chmod -R go+rX "$dest.new"
rm -rf "$dest"
mv "$dest.new" "$dest"
bin="$dest/usr/bin/qemu-system-x86_64"
if missing=$(ldd "$bin" | grep 'not found'); then
  echo "fetch-qemu-backports: $bin lacks libraries: $missing" >&2
  exit 1
fi
"$bin" -version | head -n1 >&2
echo "$bin"
