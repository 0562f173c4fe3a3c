package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/guard"
)

// docs reads every YAML document of a file into generic maps.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
}

// at walks a generic document: keys for maps, ints for lists.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func lockgateConfig(t *testing.T, text, where string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return cfg
}

func TestKustomizeBase(t *testing.T) {
	dir := "kubernetes/base"
	k := docs(t, filepath.Join(dir, "kustomization.yaml"))[0]
	byKind := map[string]map[string]any{}
	for _, r := range at(k, "resources").([]any) {
		for _, d := range docs(t, filepath.Join(dir, r.(string))) {
			byKind[d["kind"].(string)] = d
		}
	}
	for _, kind := range []string{"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget"} {
		if byKind[kind] == nil {
			t.Fatalf("no %s among the resources", kind)
		}
	}
	cm, dep := byKind["ConfigMap"], byKind["Deployment"]
	cfg := lockgateConfig(t, at(cm, "data", "config.yaml").(string), "ConfigMap config.yaml")
	if !strings.HasPrefix(cfg.Listen, "127.0.0.1:") {
		t.Errorf("listen %s: a sidecar proxy must be reachable only inside the pod", cfg.Listen)
	}
	adminPort := cfg.Admin[strings.LastIndex(cfg.Admin, ":")+1:]

	spec := at(dep, "spec", "template", "spec")
	labels := at(dep, "spec", "template", "metadata", "labels").(map[string]any)
	if !matches(at(dep, "spec", "selector", "matchLabels"), labels) {
		t.Error("the Deployment's selector does not match its pods")
	}
	var sidecar map[string]any
	for _, c := range at(spec, "initContainers").([]any) {
		if c.(map[string]any)["name"] == "lockgate" {
			sidecar = c.(map[string]any)
		}
	}
	if sidecar == nil || sidecar["restartPolicy"] != "Always" {
		t.Fatalf("lockgate is not a native sidecar (initContainers with restartPolicy Always): %v", sidecar)
	}
	ports := map[string]string{}
	for _, p := range sidecar["ports"].([]any) {
		ports[at(p, "name").(string)] = yamlText(at(p, "containerPort"))
	}
	if ports["admin"] != adminPort {
		t.Errorf("container port admin %q, but the config's admin listens on %s", ports["admin"], cfg.Admin)
	}
	for probe, path := range map[string]string{"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		if at(sidecar, probe, "httpGet", "path") != path || at(sidecar, probe, "httpGet", "port") != "admin" {
			t.Errorf("%s: %v, want GET %s on the admin port", probe, sidecar[probe], path)
		}
	}
	grace := time.Duration(at(spec, "terminationGracePeriodSeconds").(int)) * time.Second
	if need := cfg.ShutdownDrainDelay.D() + cfg.ShutdownTimeout.D(); grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v does not cover shutdownDrainDelay + shutdownTimeout (%v)", grace, need)
	}
	for _, c := range at(spec, "containers").([]any) {
		for _, e := range at(c, "env").([]any) {
			if v, _ := at(e, "value").(string); strings.HasPrefix(v, "mongodb://") && !strings.Contains(v, "localhost:"+cfg.Listen[strings.LastIndex(cfg.Listen, ":")+1:]) {
				t.Errorf("container %v connects to %s, not to the sidecar", at(c, "name"), v)
			}
		}
	}
	// Every environment variable the sidecar sets is one lockgate reads.
	known := map[string]bool{}
	for _, v := range config.EnvVars() {
		known[v.Name] = true
	}
	for _, e := range sidecar["env"].([]any) {
		if n := at(e, "name").(string); !known[n] {
			t.Errorf("sidecar env %s is not a lockgate variable", n)
		}
	}

	np := byKind["NetworkPolicy"]
	if !matches(at(np, "spec", "podSelector", "matchLabels"), labels) {
		t.Error("the NetworkPolicy does not select the pods")
	}
	admitsAdmin := false
	for _, rule := range at(np, "spec", "ingress").([]any) {
		for _, p := range at(rule, "ports").([]any) {
			if yamlText(at(p, "port")) == adminPort {
				admitsAdmin = at(rule, "from") != nil
				if !admitsAdmin {
					t.Error("the NetworkPolicy opens the admin port to everyone")
				}
			}
		}
	}
	if !admitsAdmin {
		t.Error("the NetworkPolicy does not name the admin port")
	}
	if !matches(at(byKind["PodDisruptionBudget"], "spec", "selector", "matchLabels"), labels) {
		t.Error("the PodDisruptionBudget does not select the pods")
	}
}

func TestComposeQuickStart(t *testing.T) {
	c := docs(t, "compose/docker-compose.yml")[0]
	lg := at(c, "services", "lockgate")
	if lg == nil || at(c, "services", "mongo") == nil {
		t.Fatal("services lockgate and mongo expected")
	}
	b, err := os.ReadFile("compose/lockgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := lockgateConfig(t, string(b), "compose/lockgate.yaml")
	if !strings.Contains(cfg.Upstream.URI, "mongo:27017") {
		t.Errorf("upstream %s is not the compose service", cfg.Upstream.URI)
	}
	published := strings.Join(func() (s []string) {
		for _, p := range at(lg, "ports").([]any) {
			s = append(s, p.(string))
		}
		return
	}(), " ")
	for _, addr := range []string{cfg.Listen, cfg.Admin} {
		port := addr[strings.LastIndex(addr, ":")+1:]
		if !strings.Contains(published, "127.0.0.1:"+port+":"+port) {
			t.Errorf("port %s is not published on the host's loopback: %s", port, published)
		}
	}
	for name, min := range map[string]int{"owner-secret": guard.MinOwnerSecret, "admin-token": 16} {
		f, _ := at(c, "secrets", name, "file").(string)
		b, err := os.ReadFile(filepath.Join("compose", f))
		if err != nil || len(strings.TrimSpace(string(b))) < min {
			t.Errorf("secret %s (%s): %v, at least %d characters needed", name, f, err, min)
		}
	}
	env := at(lg, "environment").(map[string]any)
	known := map[string]bool{}
	for _, v := range config.EnvVars() {
		known[v.Name] = true
	}
	for n := range env {
		if !known[n] {
			t.Errorf("environment %s is not a lockgate variable", n)
		}
	}
}

func matches(sel any, labels map[string]any) bool {
	m, ok := sel.(map[string]any)
	if !ok || len(m) == 0 {
		return false
	}
	for k, v := range m {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func yamlText(v any) string {
	b, _ := yaml.Marshal(v)
	return strings.TrimSpace(string(b))
}
