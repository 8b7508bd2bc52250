package machinedeployment

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// claimOfInfra names the NodeClaim bound to the Machine an infrastructure
// machine belongs to: its controlling Machine by owner reference, else the
// Machine of the same name (a MachineSet names both alike), or "". The
// MachineSet clones infrastructure machines from the template, so they
// carry no NodeClaim annotation of their own.
func (p *Provider) claimOfInfra(ctx context.Context, infra client.Object) string {
	name := infra.GetName()
	for _, ref := range infra.GetOwnerReferences() {
		if gv, err := schema.ParseGroupVersion(ref.APIVersion); err == nil && gv.Group == clusterv1.GroupVersion.Group && ref.Kind == "Machine" {
			name = ref.Name
			break
		}
	}
	m := &clusterv1.Machine{}
	if err := p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: infra.GetNamespace(), Name: name}, m); err != nil {
		return ""
	}
	return m.Annotations[v1alpha1.NodeClaimAnnotation]
}
