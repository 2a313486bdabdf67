#!/usr/bin/env bash
# Install isopod on a Debian or Ubuntu host and run a first sandbox.
#
#   ./scripts/install.sh            build into ./bin, fetch the kernel, build base-min, run a sandbox
#   ISOPOD_INSTALL_DEBIAN=1 ...     also build the base-debian toolchain image (several minutes)
#
# Needs root for apt-get (it uses sudo when not root). Everything else runs
# as the invoking user; state goes to $ISOPOD_HOME (default ~/.isopod).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
command -v mksquashfs >/dev/null || need_pkgs+=(squashfs-tools)
command -v debugfs >/dev/null || need_pkgs+=(e2fsprogs)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v apt-get >/dev/null || { echo "install.sh: apt-get not found; on other hosts install qemu-system-x86_64, squashfs-tools, e2fsprogs by hand and use 'isopod image fetch-kernel --from-deb FILE'" >&2; exit 1; }
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "install.sh: installing ${need_pkgs[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >&2
fi

# Go: any Go >= 1.21 fetches the toolchain go.mod asks for.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
if ! command -v go >/dev/null; then
  echo "install.sh: installing Go from the distribution" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq golang-go >&2
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

echo "install.sh: building isopod, isopod-mcp and isopod-agent into ./bin" >&2
mkdir -p bin
go build -o bin/ ./cmd/isopod ./cmd/isopod-mcp
CGO_ENABLED=0 go build -o bin/isopod-agent ./cmd/isopod-agent

bin/isopod image fetch-kernel >/dev/null
bin/isopod image build base-min >/dev/null
if [ "${ISOPOD_INSTALL_DEBIAN:-0}" = 1 ]; then
  bin/isopod image build base-debian >/dev/null
fi
echo "install.sh: first sandbox:" >&2
bin/isopod run --no-network -- uname -a
