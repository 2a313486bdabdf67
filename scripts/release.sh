#!/usr/bin/env bash
# Build isopod's release for linux/amd64 from a commit, reproducibly:
#
#   scripts/release.sh [COMMIT]      default HEAD
#
# writes, into $ISOPOD_DIST (default ./dist):
#
#   isopod_<version>_amd64.deb  isopod-<version>.x86_64.rpm
#   isopod-<version>-linux-amd64.tar.gz  SHA256SUMS
#
# The commit is exported with `git archive` and built there, so changes not
# committed are never in a release. Every input is fixed by the commit: the
# version (internal/version/VERSION, plus +g<commit> unless the commit is
# tagged v<VERSION>), SOURCE_DATE_EPOCH (the commit time), and the Go
# toolchain (go.mod's). The same commit gives the same bytes, on any
# machine. The packaging itself is tools/release, a module of its own
# (see docs/releasing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
say() { echo "release.sh: $*" >&2; }

ref=${1:-HEAD}
out=${ISOPOD_DIST:-$repo/dist}
commit=$(git rev-parse --verify -q "$ref^{commit}") || { say "no commit $ref"; exit 1; }
epoch=$(git show -s --format=%ct "$commit")
release=$(git show "$commit:internal/version/VERSION" | tr -d '[:space:]')
suffix=""
if ! git tag --points-at "$commit" | grep -qxF "v$release"; then
  suffix="+g${commit:0:8}"
fi
version=$release$suffix
if [ "$ref" = HEAD ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  say "the working tree has changes that are not committed; they are not in the release"
fi

# The toolchain go.mod names, exactly: another Go release compiles other bytes.
gomod=$(git show "$commit:go.mod")
toolchain=$(awk '/^toolchain /{print $2; exit}' <<<"$gomod")
[ -n "$toolchain" ] || toolchain=go$(awk '/^go /{print $2; exit}' <<<"$gomod")
export GOTOOLCHAIN=$toolchain
export SOURCE_DATE_EPOCH=$epoch GOFLAGS=-mod=readonly

work=$(mktemp -d "${TMPDIR:-/tmp}/isopod-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/bin" "$work/dist"
git archive --format=tar "$commit" | tar -x -C "$work/src"

say "building isopod $version from $commit ($toolchain, SOURCE_DATE_EPOCH=$epoch)"
(cd "$work/src" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildvcs=false \
  -ldflags "-s -w -buildid= -X isopod/internal/version.suffix=$suffix" \
  -o "$work/bin/" ./cmd/isopod ./cmd/isopod-mcp ./cmd/isopod-agent ./cmd/isopod-jail)

say "packaging"
(cd "$work/src/tools/release" && go run -trimpath . -src "$work/src" -bin "$work/bin" \
  -version "$version" -commit "$commit" -epoch "$epoch" -out "$work/dist" >/dev/null)

mkdir -p "$out"
rm -f "$out"/isopod_*_amd64.deb "$out"/isopod-*.x86_64.rpm "$out"/isopod-*-linux-amd64.tar.gz "$out/SHA256SUMS"
cp "$work/dist"/* "$out/"
say "wrote $out:"
(cd "$out" && cat SHA256SUMS) >&2
