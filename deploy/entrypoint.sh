#!/bin/sh
# The server image's entrypoint. Under KVM the jailed VMM opens /dev/kvm as
# the system user isopod-vmm, which must be in the device's group: give the
# image's kvm group the gid /dev/kvm has on this node, then start the server.
set -eu
if [ -c /dev/kvm ]; then
  gid=$(stat -c %g /dev/kvm)
  if [ "$(getent group kvm | cut -d: -f3)" != "$gid" ]; then
    groupmod -o -g "$gid" kvm
  fi
fi
exec /usr/local/bin/isopod-mcp "$@"
