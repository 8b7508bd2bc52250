// Package autonoderun installs and runs the AutoNode controller against a
// test world's management cluster as the packaged configuration does: its
// generated RBAC (config/rbac/autonode) and the provider's ClusterRole it
// binds (config/rbac/hub), a ServiceAccount whose token comes from the
// TokenRequest API, the binary's `autonode` subcommand, and test/podrun
// running the provider Deployments it creates. Used by test/e2e and the
// demo.
package autonoderun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/autonode"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/podrun"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Namespace of the AutoNode controller.
const Namespace = "karpenter-autonode"

// Image is the provider image the controller deploys; the pod runner maps
// it to the binary under test.
const Image = "karpenter-clusterapi:e2e"

const controllerName = "karpenter-clusterapi-autonode"

// Install creates the controller's RBAC and ServiceAccount in the hub and
// writes a kubeconfig of that ServiceAccount into dir.
func Install(ctx context.Context, hub client.Client, cfg *rest.Config, dir string) (string, error) {
	if err := client.IgnoreAlreadyExists(hub.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}})); err != nil {
		return "", err
	}
	for _, f := range []string{"config/rbac/hub/role.yaml", "config/rbac/autonode/role.yaml"} {
		if err := applyRBACFile(ctx, hub, f); err != nil {
			return "", err
		}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: controllerName}}
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: Namespace, Name: controllerName}}
	objs := []client.Object{
		sa,
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: controllerName},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controllerName},
			Subjects:   subjects,
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: controllerName},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: controllerName},
			Subjects:   subjects,
		},
	}
	for _, o := range objs {
		if err := client.IgnoreAlreadyExists(hub.Create(ctx, o)); err != nil {
			return "", fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return serviceAccountKubeconfig(ctx, cfg, sa, filepath.Join(dir, "autonode-controller.kubeconfig"))
}

// applyRBACFile creates the ClusterRoles and Roles of a generated file,
// the Roles in Namespace.
func applyRBACFile(ctx context.Context, hub client.Client, path string) error {
	f, err := os.Open(filepath.Join(environment.RepoRoot(), path))
	if err != nil {
		return err
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		var o client.Object
		switch obj["kind"] {
		case "ClusterRole":
			o = &rbacv1.ClusterRole{}
		case "Role":
			o = &rbacv1.Role{}
		default:
			continue
		}
		raw, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, o); err != nil {
			return err
		}
		if o.GetNamespace() != "" {
			o.SetNamespace(Namespace)
		}
		if cr, ok := o.(*rbacv1.ClusterRole); ok && cr.Name == autonode.DefaultHubClusterRole {
			cr.Rules = withWorldControlPlane(cr.Rules)
		}
		if err := client.IgnoreAlreadyExists(hub.Create(ctx, o)); err != nil {
			return fmt.Errorf("creating %s from %s: %w", o.GetName(), path, err)
		}
	}
}

// withWorldControlPlane grants on the world's control plane kind (its
// stand-in for a real provider's, in a group of its own) what the rules
// grant on controlplane.cluster.x-k8s.io.
func withWorldControlPlane(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, "controlplane.cluster.x-k8s.io") {
			extra := *r.DeepCopy()
			extra.APIGroups = []string{world.ControlPlaneGroup}
			return append(rules, extra)
		}
	}
	return rules
}

func serviceAccountKubeconfig(ctx context.Context, cfg *rest.Config, sa *corev1.ServiceAccount, path string) (string, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	tr, err := kube.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token of ServiceAccount %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	c := rest.AnonymousClientConfig(cfg)
	c.BearerToken = tr.Status.Token
	raw, err := environment.KubeconfigBytes(c, "autonode")
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, raw, 0o600)
}

// Controller is a running `karpenter-clusterapi autonode`.
type Controller struct {
	cmd     *exec.Cmd
	LogPath string
	done    chan struct{}
}

// StartController runs the controller with the kubeconfig Install wrote,
// deploying Image at version, leader election on, metrics on metricsAddr.
func StartController(bin, kubeconfig, version, metricsAddr, logPath string) (*Controller, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, autonode.Command, "--kubeconfig="+kubeconfig, "--version="+version, "--provider-image="+Image,
		"--leader-election-namespace="+Namespace, "--metrics-bind-address="+metricsAddr,
		"--health-probe-bind-address=0", "--zap-log-level=debug")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	c := &Controller{cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// Stop stops the controller: SIGTERM, SIGKILL after 20 s.
func (c *Controller) Stop() {
	if c == nil {
		return
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

// StartPods runs AutoNode's provider Deployments in the hub as a kubelet
// would, Image as bin.
func StartPods(cfg *rest.Config, bin, dir string) (*podrun.Runner, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return podrun.Start(podrun.Options{
		Config:   cfg,
		Selector: labels.SelectorFromSet(labels.Set{autonode.ManagedByLabel: autonode.ManagedBy}),
		Binary: func(image, command string) (string, error) {
			if image != Image || command != autonode.Binary {
				return "", fmt.Errorf("image %s command %q: not the provider under test", image, command)
			}
			return bin, nil
		},
		Dir: dir,
	})
}
