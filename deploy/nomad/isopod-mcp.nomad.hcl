# isopod-mcp on every KVM client of a Nomad cluster: a system job (one
# server per client, its state on the client) registered as a service.
# Written, not run by the test suite (integration/fleet checks that it
# parses and names the right image, ports and devices).
#
# Before running:
#   - build deploy/Containerfile and put its name where ISOPOD_MCP_IMAGE is;
#   - give KVM clients the meta isopod_kvm = "true" (client { meta { ... } });
#   - allow privileged containers in the clients' docker plugin config;
#   - replace STAGE_REGISTRY/isopod/stages with the repository stages go to;
#   - store the secrets as Nomad variables:
#       nomad var put nomad/jobs/isopod-mcp tokens=@tokens tls_crt=@tls.crt tls_key=@tls.key registry=@docker-config.json
#   - set --memory-budget-mib to what the task may use on a client.
job "isopod-mcp" {
  type = "system"

  constraint {
    attribute = "${meta.isopod_kvm}"
    value     = "true"
  }

  group "isopod" {
    network {
      port "mcp" {
        static = 8443
      }
    }

    service {
      name     = "isopod-mcp"
      port     = "mcp"
      provider = "nomad"

      check {
        type     = "http"
        protocol = "https"
        path     = "/readyz"
        interval = "5s"
        timeout  = "2s"

        tls_skip_verify = true
      }
    }

    # Fetches the kernel and builds the base images into the client's state
    # root the first time; later starts find them there.
    task "images" {
      driver = "docker"

      lifecycle {
        hook = "prestart"
      }

      config {
        image      = "ISOPOD_MCP_IMAGE"
        entrypoint = ["/bin/sh", "-c"]
        args       = ["ls /var/lib/isopod/kernels/* >/dev/null 2>&1 || isopod image fetch-kernel; [ -e /var/lib/isopod/images/base-debian.sqfs ] || isopod image build-all"]
        privileged = true
        volumes    = ["/var/lib/isopod:/var/lib/isopod"]
      }

      env {
        ISOPOD_HOME = "/var/lib/isopod"
      }

      resources {
        cpu    = 1000
        memory = 2048
      }
    }

    task "isopod-mcp" {
      driver = "docker"

      # Runs are cancelled at SIGTERM and their VMs torn down within a few
      # seconds; the HTTP listener then waits up to 10 s for responses.
      kill_timeout = "30s"

      config {
        image = "ISOPOD_MCP_IMAGE"
        ports = ["mcp"]

        # The VMM jail makes namespaces and cgroups of its own for every VM.
        privileged = true

        devices = [
          {
            host_path      = "/dev/kvm"
            container_path = "/dev/kvm"
          }
        ]

        volumes = ["/var/lib/isopod:/var/lib/isopod"]

        args = [
          "--listen=0.0.0.0:8443",
          "--token-file=/secrets/tokens",
          "--tls-cert=/secrets/tls.crt",
          "--tls-key=/secrets/tls.key",
          "--stage-registry=STAGE_REGISTRY/isopod/stages",
          "--push-commits",
        ]
      }

      env {
        ISOPOD_HOME   = "/var/lib/isopod"
        DOCKER_CONFIG = "/secrets/registry"
      }

      template {
        destination = "secrets/tokens"
        perms       = "0400"
        data        = "{{ with nomadVar \"nomad/jobs/isopod-mcp\" }}{{ .tokens }}{{ end }}"
      }

      template {
        destination = "secrets/tls.crt"
        perms       = "0400"
        data        = "{{ with nomadVar \"nomad/jobs/isopod-mcp\" }}{{ .tls_crt }}{{ end }}"
      }

      template {
        destination = "secrets/tls.key"
        perms       = "0400"
        data        = "{{ with nomadVar \"nomad/jobs/isopod-mcp\" }}{{ .tls_key }}{{ end }}"
      }

      template {
        destination = "secrets/registry/config.json"
        perms       = "0400"
        data        = "{{ with nomadVar \"nomad/jobs/isopod-mcp\" }}{{ .registry }}{{ end }}"
      }

      resources {
        cpu    = 1000
        memory = 2048
      }
    }
  }
}
