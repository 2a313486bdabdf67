package egress

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestPolicyImportsNoNetworking keeps the policy pure: nothing it imports,
// directly or not, may open a socket, parse a wire protocol or reach the
// packages that do.
func TestPolicyImportsNoNetworking(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command: ", err)
	}
	out, err := exec.Command("go", "list", "-json=ImportPath,Deps", "isopod/internal/egress").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkg struct {
		ImportPath string
		Deps       []string
	}
	if err := json.Unmarshal(out, &pkg); err != nil {
		t.Fatal(err)
	}
	if len(pkg.Deps) == 0 {
		t.Fatalf("go list gave no dependencies for %s", pkg.ImportPath)
	}
	forbidden := func(dep string) bool {
		switch {
		case dep == "net", strings.HasPrefix(dep, "net/") && dep != "net/netip":
			return true // sockets, HTTP, mail, RPC
		case strings.HasPrefix(dep, "isopod/internal/") && dep != "isopod/internal/errdefs":
			return true // netstack, egress/proxy, egress/flightrec, egress/sniff, ...
		case strings.HasPrefix(dep, "gvisor.dev/"), strings.HasPrefix(dep, "github.com/miekg/"),
			strings.HasPrefix(dep, "golang.org/x/net/") && dep != "golang.org/x/net/idna":
			return true
		}
		return false
	}
	for _, dep := range pkg.Deps {
		if forbidden(dep) {
			t.Errorf("the egress policy depends on %s; keep networking in netstack, egress/proxy, egress/sniff or egress/flightrec", dep)
		}
	}
}
