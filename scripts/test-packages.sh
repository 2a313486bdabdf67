#!/usr/bin/env bash
# Test isopod's release end to end, as CI does (.ci/run runs this):
#
#   0. vet and test tools/release, the packaging program;
#   1. build the release of HEAD into dist/ with scripts/release.sh, then
#      again into a temporary directory (with an empty Go build cache when
#      ISOPOD_PKG_EMPTY_CACHE=1);
#   2. meanwhile, make a fresh Debian 12 tree with debootstrap (minbase);
#   3. go test ./integration/packaging, which checks SHA256SUMS, the .deb's
#      and the .rpm's metadata and files (rpm -qpl), lintian's verdict, the
#      two builds byte for byte, and the tarball run from where it is
#      unpacked; and installs the .deb into the tree, entered as a container
#      with its own root (bubblewrap), where apt resolves its dependencies,
#      runs isopod there (--version, image fetch-kernel, image build
#      initramfs base-min, doctor, run -- true), purges it, and checks that
#      nothing of it is left outside $ISOPOD_HOME.
#
# Needs root, the Go module proxy and a Debian mirror, and lintian, rpm,
# bubblewrap and debootstrap:
#
#   apt-get install lintian rpm bubblewrap debootstrap
#
# ISOPOD_DEBIAN_MIRROR picks the mirror (default http://deb.debian.org/debian).
# Nothing is cached between runs: the tree and the second build's cache are
# made afresh and removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
say() { echo "test-packages.sh: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  say "needs root (debootstrap, and installing the .deb into the tree)"
  exit 1
fi
missing=()
for tool in lintian rpm bwrap debootstrap dpkg-deb; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "missing ${missing[*]}: apt-get install lintian rpm bubblewrap debootstrap"
  exit 1
fi
export ISOPOD_DEBIAN_MIRROR=${ISOPOD_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# One commit for both builds, even if HEAD moves meanwhile.
commit=$(git rev-parse --verify HEAD)

work=$(mktemp -d "${TMPDIR:-/tmp}/isopod-pkgtest.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
phase() { say "$1 took $((SECONDS - $2)) s"; }

say "the packaging program's own tests (tools/release is a module of its own, outside go test ./...)"
(cd tools/release && go vet . && go test -count=1 .)

say "debootstrap of a minbase bookworm tree, in the background"
t=$SECONDS
(debootstrap --variant=minbase bookworm "$work/tree" "$ISOPOD_DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1; echo $((SECONDS - t)) >"$work/debootstrap.secs") &
debootstrap_pid=$!

t=$SECONDS
scripts/release.sh "$commit"
phase "the release build" "$t"
# The second build starts from a fresh export of the commit at another
# path and writes every archive again: what the bytes depend on besides the
# compiler (file order, modes, times, nfpm's output) is built twice. It
# shares the Go build cache, whose entries are keyed by their inputs; set
# ISOPOD_PKG_EMPTY_CACHE=1 to compile everything again too (several more
# minutes on two cores).
t=$SECONDS
if [ "${ISOPOD_PKG_EMPTY_CACHE:-0}" = 1 ]; then
  GOCACHE="$work/gocache" ISOPOD_DIST="$work/dist-again" scripts/release.sh "$commit"
  phase "the second release build, with an empty Go build cache" "$t"
else
  ISOPOD_DIST="$work/dist-again" scripts/release.sh "$commit"
  phase "the second release build" "$t"
fi

if ! wait "$debootstrap_pid"; then
  tail -n 20 "$work/debootstrap.log" >&2
  say "debootstrap failed"
  exit 1
fi
say "debootstrap took $(cat "$work/debootstrap.secs") s (alongside the builds)"

t=$SECONDS
ISOPOD_DIST="$repo/dist" ISOPOD_DIST_AGAIN="$work/dist-again" ISOPOD_PACKAGE_TREE="$work/tree" \
  go test -count=1 -timeout 45m -v ./integration/packaging/
phase "go test ./integration/packaging" "$t"
say "all package tests passed in $((SECONDS - start)) s"
