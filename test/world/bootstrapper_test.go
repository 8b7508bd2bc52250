package world_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// A MachineDeployment bootstrapped from a KubeadmConfigTemplate: Cluster
// API clones a KubeadmConfig per Machine, the simulated bootstrap provider
// renders its data Secret, and the simulated kubelet registers the Node with
// the template's taints, node labels and allocatable from its kubelet
// arguments.
func testKubeadmBootstrap(ctx context.Context, t *testing.T, w *world.World) {
	hub, spoke := w.Hub.Client, w.Spoke.Client
	args := map[string]string{
		"max-pods":        "20",
		"kube-reserved":   "cpu=200m,memory=512Mi",
		"system-reserved": "cpu=100m,memory=256Mi",
		"eviction-hard":   "memory.available<5%",
		"node-labels":     "example.com/pool=kubeadm",
	}
	if _, err := w.CreateKubeadmConfigTemplate(ctx, "kubeadm-workers", args); err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-kubeadm", ClusterName: w.ClusterName,
		InfraTemplate: "m5-large", BootstrapTemplate: "kubeadm-workers", Replicas: 1,
	})
	if err := hub.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	var node corev1.Node
	waitFor(ctx, t, 90*time.Second, "a Ready Node bootstrapped by kubeadm", func(ctx context.Context) (bool, string, error) {
		ms, err := machinesOf(ctx, hub, w.Namespace, md.Name)
		if err != nil || len(ms) != 1 {
			return false, fmt.Sprintf("%d Machines", len(ms)), err
		}
		ns, err := simulatedNodes(ctx, spoke)
		if err != nil {
			return false, "", err
		}
		for _, n := range ns {
			if n.Name == ms[0].Status.NodeRef.Name && nodeReady(&n) {
				node = n
				return true, "", nil
			}
		}
		return false, describeMachines(ms), nil
	})

	ms, err := machinesOf(ctx, hub, w.Namespace, md.Name)
	if err != nil {
		t.Fatal(err)
	}
	m := ms[0]
	if !m.Spec.Bootstrap.ConfigRef.IsDefined() || m.Spec.Bootstrap.ConfigRef.Kind != world.KubeadmConfigKind || ptr.Deref(m.Spec.Bootstrap.DataSecretName, "") == "" {
		t.Fatalf("Machine bootstrap %+v: want a KubeadmConfig reference and the data Secret Cluster API copied from its status", m.Spec.Bootstrap)
	}
	cfg := &bootstrapv1.KubeadmConfig{}
	if err := hub.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, cfg); err != nil {
		t.Fatal(err)
	}
	if !ptr.Deref(cfg.Status.Initialization.DataSecretCreated, false) || cfg.Status.DataSecretName != *m.Spec.Bootstrap.DataSecretName {
		t.Errorf("KubeadmConfig status %+v, Machine dataSecretName %s", cfg.Status, *m.Spec.Bootstrap.DataSecretName)
	}
	owned := false
	for _, ref := range cfg.OwnerReferences {
		owned = owned || (ref.Kind == "Machine" && ref.Name == m.Name && ptr.Deref(ref.Controller, false))
	}
	if !owned {
		t.Errorf("KubeadmConfig owners %+v: want the Machine %s as controller", cfg.OwnerReferences, m.Name)
	}
	secret := &corev1.Secret{}
	if err := hub.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: cfg.Status.DataSecretName}, secret); err != nil {
		t.Fatal(err)
	}
	if len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].UID != cfg.UID {
		t.Errorf("data Secret owners %+v: want the KubeadmConfig", secret.OwnerReferences)
	}

	if !hasTaint(&node, world.UnregisteredTaint.Key) || node.Labels["example.com/pool"] != "kubeadm" {
		t.Errorf("Node taints %v labels %v: want the template's taint and node label", node.Spec.Taints, node.Labels)
	}
	memory := resource.MustParse("8Gi")
	evict := int64(math.Ceil(float64(memory.Value()) * 0.05))
	wantMemory := memory.Value() - (512+256)<<20 - evict
	for res, want := range map[corev1.ResourceName]int64{
		corev1.ResourceCPU:    1700, // millicores
		corev1.ResourceMemory: wantMemory,
		corev1.ResourcePods:   20,
		// An eviction-hard without nodefs.available drops the kubelet's default one.
		corev1.ResourceEphemeralStorage: 20 << 30,
	} {
		got := node.Status.Allocatable[res]
		v := got.Value()
		if res == corev1.ResourceCPU {
			v = got.MilliValue()
		}
		if v != want {
			t.Errorf("Node allocatable %s = %s, want %d", res, got.String(), want)
		}
	}
	if pods := node.Status.Capacity[corev1.ResourcePods]; pods.Value() != 20 {
		t.Errorf("Node capacity pods = %s, want 20", pods.String())
	}
	if err := hub.Delete(ctx, md); err != nil {
		t.Error(err)
	}
}
