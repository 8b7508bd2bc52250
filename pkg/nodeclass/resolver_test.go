package nodeclass

import (
	"context"
	"net"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	_ "github.com/autonode/karpenter-clusterapi/pkg/apis" // registers the types in client-go's scheme
	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	nodeclassstatus "github.com/autonode/karpenter-clusterapi/pkg/controllers/nodeclass/status"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// A Machine-mode NodeClass resolved while the hub does not answer gets a
// transient error, which keeps its status: never a problem that would make
// it not Ready (Karpenter would then delete the NodeClaims launching).
func TestResolveWithoutHubIsTransient(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there: connection refused
	h, err := hub.New(&rest.Config{Host: "https://" + addr, Timeout: time.Second}, scheme.Scheme, hub.Scope{Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	r := NewResolver(h, instancetype.NewStore(), nil)
	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "m"},
		Spec: v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
			InfrastructureTemplates: v1alpha1.InfrastructureTemplates{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachineTemplate"},
			Bootstrap:               v1alpha1.Bootstrap{ConfigRef: &v1alpha1.TemplateReference{APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfigTemplate", Name: "workers"}},
		}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := r.Resolve(ctx, nc)
	if !nodeclassstatus.IsTransient(err) {
		t.Fatalf("Resolve without a hub = %+v, %v; want a transient error", res, err)
	}
	if problem, err := r.checkExists(ctx, schema.GroupKind{Group: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfigTemplate"}, "workers", "spec.machineTemplate.bootstrap.configRef"); problem != "" || err == nil {
		t.Fatalf("checkExists without a hub = %q, %v; want no problem and an error", problem, err)
	}
}
