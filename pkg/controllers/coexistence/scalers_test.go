package coexistence

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

var hubEnv *environment.Cluster

func TestMain(m *testing.M) {
	var err error
	if hubEnv, err = environment.StartHub(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = hubEnv.Stop()
	os.Exit(code)
}

// as returns a client whose writes the API server records under the field
// manager named by the user agent, as it does for every client.
func as(t *testing.T, userAgent string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(hubEnv.Config)
	cfg.UserAgent = userAgent
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func get(t *testing.T, md *clusterv1.MachineDeployment) *clusterv1.MachineDeployment {
	t.Helper()
	cur := &clusterv1.MachineDeployment{}
	if err := hubEnv.Client.Get(context.Background(), client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

func setReplicas(t *testing.T, c client.Client, md *clusterv1.MachineDeployment, n int32) {
	t.Helper()
	cur := get(t, md)
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Replicas = &n
	if err := c.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// The managedFields the API server really writes tell the provider's
// replica changes from cluster-autoscaler's (scale subresource) and from a
// direct writer's, whoever created the MachineDeployment.
func TestReplicaWritersFromManagedFields(t *testing.T) {
	ctx := context.Background()
	_ = hubEnv.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "coexist"}})
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{Namespace: "coexist", Name: "workers", ClusterName: "c1", Member: true,
		Annotations: map[string]string{clusterv1.AutoscalerMinSizeAnnotation: "0", clusterv1.AutoscalerMaxSizeAnnotation: "5"}})
	if err := as(t, "kubectl/v1.36.0").Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	provider := as(t, hub.FieldManager+"/v1.15.0")
	setReplicas(t, provider, md, 1)
	if cur := get(t, md); !ProviderOwnsReplicas(cur) || len(ReplicaWriters(cur)) != 0 {
		t.Fatalf("after the provider's raise: owns=%v writers=%v", ProviderOwnsReplicas(cur), ReplicaWriters(cur))
	}

	// cluster-autoscaler scales through the scale subresource.
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
	if err := as(t, "cluster-autoscaler/v1.33.0").SubResource("scale").Update(ctx, get(t, md), client.WithSubResourceBody(scale)); err != nil {
		t.Fatal(err)
	}
	cur := get(t, md)
	ws := ReplicaWriters(cur)
	if ProviderOwnsReplicas(cur) || len(ws) != 1 || ws[0].Manager != "cluster-autoscaler" || ws[0].Subresource != "scale" || !ws[0].Autoscaler() {
		t.Fatalf("after cluster-autoscaler's scale: owns=%v writers=%+v", ProviderOwnsReplicas(cur), ws)
	}

	t.Logf("after cluster-autoscaler: %s", ws[0])
	// The provider's next write takes the field back.
	setReplicas(t, provider, md, 4)
	if cur := get(t, md); !ProviderOwnsReplicas(cur) || len(ReplicaWriters(cur)) != 0 {
		t.Fatalf("after the provider's write: owns=%v writers=%v", ProviderOwnsReplicas(cur), ReplicaWriters(cur))
	}

	// A script patching spec.replicas is another writer, not an autoscaler.
	setReplicas(t, as(t, "resize-script"), md, 2)
	cur = get(t, md)
	ws = ReplicaWriters(cur)
	if ProviderOwnsReplicas(cur) || len(ws) != 1 || ws[0].Manager != "resize-script" || ws[0].Autoscaler() {
		t.Fatalf("after a direct patch: owns=%v writers=%+v", ProviderOwnsReplicas(cur), ws)
	}
	if msg := changeMessage(4, 2, ws); !containsAll(msg, "from 4 to 2", "resize-script") {
		t.Errorf("event message %q", msg)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
