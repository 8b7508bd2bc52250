package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The test binary re-executes itself as the real binary when this variable is set.
const runMainEnv = "KARPENTER_CLUSTERAPI_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const unreachableKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`

func TestBadConfigurationExitsWithOneLineNamingTheFlag(t *testing.T) {
	dir := t.TempDir()
	unreachable := filepath.Join(dir, "unreachable.kubeconfig")
	if err := os.WriteFile(unreachable, []byte(unreachableKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	// A server that answers like an API server's /version: reachable.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"36","gitVersion":"v1.36.3"}`))
	}))
	defer srv.Close()
	reachable := filepath.Join(dir, "reachable.kubeconfig")
	if err := os.WriteFile(reachable, []byte(strings.Replace(unreachableKubeconfig, "https://127.0.0.1:1", srv.URL, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage.kubeconfig")
	if err := os.WriteFile(garbage, []byte("this: [is not a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{name: "cluster name without namespace", args: []string{"--cluster-api-cluster-name=c1"},
			want: "--cluster-api-cluster-name (CLUSTER_API_CLUSTER_NAME) requires --cluster-api-namespace"},
		{name: "cluster name without namespace, from env", env: []string{"CLUSTER_API_CLUSTER_NAME=c1"},
			want: "--cluster-api-cluster-name (CLUSTER_API_CLUSTER_NAME) requires --cluster-api-namespace"},
		{name: "missing spoke kubeconfig", args: []string{"--kubeconfig=" + filepath.Join(dir, "missing")},
			want: "--kubeconfig: cannot read kubeconfig"},
		{name: "garbage hub kubeconfig", args: []string{"--kubeconfig=" + unreachable, "--cluster-api-kubeconfig=" + garbage},
			want: "--cluster-api-kubeconfig (CLUSTER_API_KUBECONFIG): cannot read kubeconfig"},
		{name: "unknown flag", args: []string{"--cluster-api-namespce=x"},
			want: "flag provided but not defined: -cluster-api-namespce"},
		{name: "unreachable spoke", args: []string{"--kubeconfig=" + unreachable},
			want: "--kubeconfig: workload cluster at https://127.0.0.1:1 is not reachable"},
		{name: "unreachable hub", args: []string{"--kubeconfig=" + reachable, "--cluster-api-kubeconfig=" + unreachable},
			want: "--cluster-api-kubeconfig: management cluster at https://127.0.0.1:1 is not reachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], tc.args...)
			cmd.Env = append(os.Environ(), runMainEnv+"=1", "DISABLE_LEADER_ELECTION=true", "METRICS_PORT=0", "HEALTH_PROBE_PORT=0")
			cmd.Env = append(cmd.Env, tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if err == nil {
				t.Fatalf("want a non-zero exit, got success; stderr: %s", stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 {
				t.Fatalf("want exactly one line on stderr, got %d:\n%s", len(lines), stderr.String())
			}
			if !strings.HasPrefix(lines[0], "karpenter-clusterapi: ") || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("want a line containing %q, got %q", tc.want, lines[0])
			}
		})
	}
}

// The converter subcommand is dispatched before core's flag parsing (which
// would refuse its flags) and fails on bad input with one line naming the
// flag.
func TestConvertSubcommandBadInput(t *testing.T) {
	dir := t.TempDir()
	unreachable := filepath.Join(dir, "unreachable.kubeconfig")
	if err := os.WriteFile(unreachable, []byte(unreachableKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown expander", []string{"--expander=cheapest"}, 2, "--expander: \"cheapest\" is not an expander"},
		{"missing priority config", []string{"--priority-config=" + filepath.Join(dir, "missing.yaml")}, 2, "--priority-config"},
		{"bad selector", []string{"--selector=a in (", "--cluster-api-kubeconfig=" + unreachable}, 2, "--selector"},
		{"unreachable management cluster", []string{"--cluster-api-kubeconfig=" + unreachable}, 1, "reading the management cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], append([]string{"convert-cluster-autoscaler"}, tc.args...)...)
			cmd.Env = append(os.Environ(), runMainEnv+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			exit, ok := err.(*exec.ExitError)
			if !ok || exit.ExitCode() != tc.code {
				t.Fatalf("want exit code %d, got %v; stderr: %s", tc.code, err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "karpenter-clusterapi convert-cluster-autoscaler: ") || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("want one line containing %q, got:\n%s", tc.want, stderr.String())
			}
		})
	}
}
