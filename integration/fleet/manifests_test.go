package fleet

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"sigs.k8s.io/yaml"
)

// The deployments in deploy/ are written, not run here: these tests hold
// them to what the server needs (the image placeholder, the MCP port,
// /dev/kvm, the token and TLS files where the flags point).

const imagePlaceholder = "ISOPOD_MCP_IMAGE"

func deployDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// k8sObject is what the test reads of a Kubernetes object.
type k8sObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Spec podSpec `json:"spec"`
		} `json:"template"`
		Selector map[string]any `json:"selector"`
		Ports    []struct {
			Port       int    `json:"port"`
			TargetPort any    `json:"targetPort"`
			Name       string `json:"name"`
		} `json:"ports"`
	} `json:"spec"`
}

type container struct {
	Name  string   `json:"name"`
	Image string   `json:"image"`
	Args  []string `json:"args"`
	Ports []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	ReadinessProbe struct {
		HTTPGet struct {
			Path, Scheme string
			Port         any
		} `json:"httpGet"`
	} `json:"readinessProbe"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

type podSpec struct {
	NodeSelector   map[string]string `json:"nodeSelector"`
	InitContainers []container       `json:"initContainers"`
	Containers     []container       `json:"containers"`
	Volumes        []struct {
		Name     string `json:"name"`
		HostPath *struct {
			Path, Type string
		} `json:"hostPath"`
		Secret *struct {
			SecretName string `json:"secretName"`
		} `json:"secret"`
	} `json:"volumes"`
}

func TestKubernetesManifest(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir(t), "kubernetes", "isopod-mcp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var o k8sObject
		if err := yaml.UnmarshalStrict([]byte(doc), &map[string]any{}); err != nil {
			t.Fatalf("a document does not parse: %v", err)
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		objs[o.Kind] = o
	}
	ds, ok := objs["DaemonSet"]
	if !ok || objs["Service"].Kind == "" {
		t.Fatalf("want a DaemonSet and a Service, got %v", objs)
	}
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 1 {
		t.Fatalf("containers %+v", pod.Containers)
	}
	c := pod.Containers[0]
	if c.Image != imagePlaceholder || pod.InitContainers[0].Image != imagePlaceholder {
		t.Errorf("images %q, %q; want the placeholder %s", c.Image, pod.InitContainers[0].Image, imagePlaceholder)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "mcp" || c.Ports[0].ContainerPort != 8443 || !slices.Contains(c.Args, "--listen=0.0.0.0:8443") {
		t.Errorf("ports %+v, args %q", c.Ports, c.Args)
	}
	if p := c.ReadinessProbe.HTTPGet; p.Path != "/readyz" || p.Scheme != "HTTPS" {
		t.Errorf("readiness probe %+v", p)
	}
	if pod.NodeSelector["isopod/kvm"] != "true" {
		t.Errorf("node selector %v", pod.NodeSelector)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	vols := map[string]string{}
	for _, v := range pod.Volumes {
		switch {
		case v.HostPath != nil:
			vols[v.Name] = v.HostPath.Path + " " + v.HostPath.Type
		case v.Secret != nil:
			vols[v.Name] = "secret " + v.Secret.SecretName
		}
	}
	if mounts["kvm"] != "/dev/kvm" || vols["kvm"] != "/dev/kvm CharDevice" {
		t.Errorf("/dev/kvm: mount %q, volume %q", mounts["kvm"], vols["kvm"])
	}
	for flag, vol := range map[string]string{"--token-file=": "tokens", "--tls-cert=": "tls", "--tls-key=": "tls"} {
		i := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, flag) })
		if i < 0 || !strings.HasPrefix(strings.TrimPrefix(c.Args[i], flag), mounts[vol]+"/") || !strings.HasPrefix(vols[vol], "secret ") {
			t.Errorf("%s does not point into the %s secret's mount (%q, %q)", flag, vol, mounts[vol], vols[vol])
		}
	}
	svc := objs["Service"]
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort != "mcp" {
		t.Errorf("service ports %+v", svc.Spec.Ports)
	}
}

func TestNomadJob(t *testing.T) {
	path := filepath.Join(deployDir(t), "nomad", "isopod-mcp.nomad.hcl")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	job := blocks(f.Body.(*hclsyntax.Body), "job")
	if len(job) != 1 || job[0].Labels[0] != "isopod-mcp" || attr(t, job[0].Body, "type").AsString() != "system" {
		t.Fatalf("want one system job isopod-mcp")
	}
	group := blocks(job[0].Body, "group")[0]
	port := blocks(blocks(group.Body, "network")[0].Body, "port")[0]
	if port.Labels[0] != "mcp" || attr(t, port.Body, "static").AsBigFloat().String() != "8443" {
		t.Errorf("port %s", port.Labels)
	}
	var server *hclsyntax.Block
	for _, task := range blocks(group.Body, "task") {
		cfg := blocks(task.Body, "config")[0]
		if img := attr(t, cfg.Body, "image").AsString(); img != imagePlaceholder {
			t.Errorf("task %s: image %q, want the placeholder", task.Labels[0], img)
		}
		if task.Labels[0] == "isopod-mcp" {
			server = cfg
		}
	}
	if server == nil {
		t.Fatal("no task isopod-mcp")
	}
	dev := attr(t, server.Body, "devices").AsValueSlice()
	if len(dev) != 1 || dev[0].GetAttr("host_path").AsString() != "/dev/kvm" || dev[0].GetAttr("container_path").AsString() != "/dev/kvm" {
		t.Errorf("devices %v", dev)
	}
	var args []string
	for _, v := range attr(t, server.Body, "args").AsValueSlice() {
		args = append(args, v.AsString())
	}
	for _, want := range []string{"--listen=0.0.0.0:8443", "--token-file=/secrets/tokens", "--tls-cert=/secrets/tls.crt", "--tls-key=/secrets/tls.key"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if ports := attr(t, server.Body, "ports").AsValueSlice(); len(ports) != 1 || ports[0].AsString() != "mcp" {
		t.Errorf("ports %v", ports)
	}
}

func blocks(b *hclsyntax.Body, typ string) []*hclsyntax.Block {
	var out []*hclsyntax.Block
	for _, bl := range b.Blocks {
		if bl.Type == typ {
			out = append(out, bl)
		}
	}
	return out
}

// attr evaluates a literal attribute.
func attr(t *testing.T, b *hclsyntax.Body, name string) cty.Value {
	t.Helper()
	a, ok := b.Attributes[name]
	if !ok {
		t.Fatalf("no attribute %s", name)
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", name, diags)
	}
	return v
}
