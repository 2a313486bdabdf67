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

# A user's PATH on Debian lacks the sbin directories, where debugfs and
# debootstrap live: look there too, as isopod itself does.
have() { command -v "$1" >/dev/null || [ -x "/usr/local/sbin/$1" ] || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
need_pkgs=()
have qemu-system-x86_64 || need_pkgs+=(qemu-system-x86)
have mksquashfs || need_pkgs+=(squashfs-tools)
have debugfs || need_pkgs+=(e2fsprogs)
have debootstrap || need_pkgs+=(debootstrap)
have newuidmap || need_pkgs+=(uidmap)   # the VMM jail's subordinate ids
have unshare || need_pkgs+=(util-linux)
command -v apt-get >/dev/null || { echo "install.sh: apt-get not found; on other hosts install qemu-system-x86_64, squashfs-tools, e2fsprogs by hand and use 'isopod image fetch-kernel --from-deb FILE'" >&2; exit 1; }
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "install.sh: installing ${need_pkgs[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >&2
fi

# The VMM jail: when isopod runs as root, every VMM runs as this system
# user (in the kvm group, so that /dev/kvm opens).
if ! getent passwd isopod-vmm >/dev/null; then
  echo "install.sh: creating the system user isopod-vmm for the VMM jail" >&2
  $SUDO useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin isopod-vmm
fi
if getent group kvm >/dev/null; then $SUDO usermod -a -G kvm isopod-vmm; fi

# Go: any Go >= 1.21 fetches the toolchain go.mod asks for by itself. An
# older one (Debian 12 ships 1.19) downloads it as a module through the Go
# module proxy, and links it as /usr/local/bin/go so that `go test ./...`
# finds it too.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
if ! command -v go >/dev/null; then
  echo "install.sh: installing Go from the distribution" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq golang-go >&2
fi
have=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n' 1.21 "$have" | sort -V | head -n1)" != 1.21 ]; then
  want=$(awk '/^go /{print $2; exit}' go.mod)
  tc="golang.org/toolchain@v0.0.1-go${want}.linux-$(go env GOARCH)"
  echo "install.sh: Go $have cannot fetch toolchains; downloading go$want as $tc" >&2
  dir=$(cd / && GOFLAGS=-modcacherw go mod download -json "$tc" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "install.sh: could not download $tc" >&2; exit 1; }
  chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
  $SUDO ln -sf "$dir/bin/go" /usr/local/bin/go
  $SUDO ln -sf "$dir/bin/gofmt" /usr/local/bin/gofmt
  export PATH="$dir/bin:$PATH"
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

echo "install.sh: building isopod, isopod-mcp, isopod-agent and isopod-jail into ./bin" >&2
mkdir -p bin
# The version is internal/version/VERSION; a build of anything but the
# commit tagged v<VERSION> says so with a +g<commit> (and .dirty) suffix.
suffix=""
if git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  release=$(tr -d '[:space:]' < internal/version/VERSION)
  if ! git tag --points-at HEAD 2>/dev/null | grep -qxF "v$release"; then
    suffix="+g$(git rev-parse --short=8 HEAD)"
  fi
  if ! git diff --quiet HEAD -- 2>/dev/null; then
    suffix="${suffix:-+}${suffix:+.}dirty"
  fi
fi
go build -ldflags "-X isopod/internal/version.suffix=$suffix" -o bin/ ./cmd/isopod ./cmd/isopod-mcp
CGO_ENABLED=0 go build -o bin/isopod-agent ./cmd/isopod-agent
CGO_ENABLED=0 go build -o bin/isopod-jail ./cmd/isopod-jail

bin/isopod image fetch-kernel >/dev/null
bin/isopod image build base-min >/dev/null
if [ "${ISOPOD_INSTALL_DEBIAN:-0}" = 1 ]; then
  bin/isopod image build base-debian >/dev/null
fi
echo "install.sh: first sandbox:" >&2
bin/isopod run --no-network -- uname -a
