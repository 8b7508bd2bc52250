package operator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

func kubeletArgs(args ...string) []bootstrapv1.Arg {
	var out []bootstrapv1.Arg
	for i := 0; i+1 < len(args); i += 2 {
		out = append(out, bootstrapv1.Arg{Name: args[i], Value: ptr.To(args[i+1])})
	}
	return out
}

// waitResolvedMessage waits until the NodeClass is Ready and the
// InstanceTypesResolved message satisfies ok, and returns the message.
func waitResolvedMessage(t *testing.T, name string, ok func(string) bool) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := spoke.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return false, nil
		}
		c := nc.StatusConditions().Get(v1alpha1.ConditionTypeInstanceTypesResolved)
		if c == nil || c.Status != metav1.ConditionTrue {
			return false, nil
		}
		msg = c.Message
		return ok(msg), nil
	})
	if err != nil {
		t.Fatalf("NodeClass %s: InstanceTypesResolved message never as wanted; last: %q", name, msg)
	}
	return msg
}

// Bad kubelet settings, in a MachineDeployment's KubeadmConfigTemplate or in
// the NodeClass's spec.kubelet, are reported on the NodeClass (which stays
// Ready: each falls back to the next source), and a fixed template is read
// again through the watch.
func TestBadKubeletSettingsAreReportedOnTheNodeClass(t *testing.T) {
	ctx := context.Background()
	ensureNamespace(t, hub.Client, scopedNamespace)
	tmpl := &bootstrapv1.KubeadmConfigTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: scopedNamespace, Name: "kubelet-workers"},
		Spec: bootstrapv1.KubeadmConfigTemplateSpec{Template: bootstrapv1.KubeadmConfigTemplateResource{Spec: bootstrapv1.KubeadmConfigSpec{
			JoinConfiguration: bootstrapv1.JoinConfiguration{NodeRegistration: bootstrapv1.NodeRegistrationOptions{
				KubeletExtraArgs: kubeletArgs("max-pods", "lots", "kube-reserved", "cpu=-100m", "system-reserved", "memory=1Gi"),
			}},
		}}},
	}
	if err := hub.Client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hub.Client.Delete(ctx, tmpl) })
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: scopedNamespace, Name: "kubelet-m5", ClusterName: scopedCluster, Member: true,
		Labels:            map[string]string{"pool": "kubelet"},
		TemplateLabels:    map[string]string{corev1.LabelInstanceTypeStable: "m5.large"},
		Annotations:       m5LargeCapacity,
		BootstrapTemplate: tmpl.Name,
	})
	if err := hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hub.Client.Delete(ctx, md) })

	// The API server refuses what the CRD can tell is wrong.
	bad := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelet-refused"},
		Spec: v1alpha1.ClusterAPINodeClassSpec{
			ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "kubelet"}},
			Kubelet:                  &v1alpha1.KubeletConfiguration{KubeReserved: map[string]string{"cpu": "-1", "gpu": "1"}},
		},
	}
	if err := spoke.Client.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "negative") || !strings.Contains(err.Error(), "valid keys for kubeReserved") {
		_ = spoke.Client.Delete(ctx, bad)
		t.Fatalf("want a negative and an unknown reservation refused, got %v", err)
	}

	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "kubelet"},
		Spec: v1alpha1.ClusterAPINodeClassSpec{
			ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "kubelet"}},
			Kubelet: &v1alpha1.KubeletConfiguration{
				MaxPods:        ptr.To[int32](0),
				SystemReserved: map[string]string{"memory": "1Gb"},
				EvictionHard:   map[string]string{"memory.available": "150%"},
			},
		},
	}
	if err := spoke.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spoke.Client.Delete(ctx, nc) })

	want := []string{
		`KubeadmConfigTemplate team-a/kubelet-workers spec.template.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs max-pods: "lots"`,
		`kubeletExtraArgs kube-reserved: "cpu=-100m"`,
		`spec.kubelet.maxPods: "0"`,
		`spec.kubelet.systemReserved.memory: "1Gb"`,
		`spec.kubelet.evictionHard.memory.available: "150%"`,
	}
	msg := waitResolvedMessage(t, nc.Name, func(m string) bool {
		for _, w := range want {
			if !strings.Contains(m, w) {
				return false
			}
		}
		return true
	})
	if !strings.Contains(msg, "MachineDeployment team-a/kubelet-m5") {
		t.Errorf("the template's problems must name the MachineDeployment: %s", msg)
	}

	// Fixing the template is seen through the watch on KubeadmConfigTemplates.
	patch := client.MergeFrom(tmpl.DeepCopy())
	tmpl.Spec.Template.Spec.JoinConfiguration.NodeRegistration.KubeletExtraArgs = kubeletArgs("max-pods", "40", "kube-reserved", "cpu=100m")
	if err := hub.Client.Patch(ctx, tmpl, patch); err != nil {
		t.Fatal(err)
	}
	msg = waitResolvedMessage(t, nc.Name, func(m string) bool { return !strings.Contains(m, "kubeletExtraArgs") })
	if !strings.Contains(msg, "spec.kubelet.maxPods") {
		t.Errorf("the NodeClass's own problems must remain: %s", msg)
	}
}
