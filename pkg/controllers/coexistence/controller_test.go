package coexistence

import (
	"context"
	"testing"

	"github.com/awslabs/operatorpkg/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// A NodeClass the status controller has not written yet gets no status
// write from this controller: its status arrives whole in that one write
// (Ready with what was resolved), never first as conditions initialized to
// Unknown. Karpenter's own suite "should delete a NodeClaim if it
// references a NodeClass that isn't Ready" read that first write, and the
// second one made its check of its admission policy pass too early (CI).
// Nor does a Machine-mode NodeClass (no selector) get one: nothing to say.
func TestNoStatusWriteBeforeTheStatusControllersOrWithNothingToSay(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for name, nc := range map[string]*v1alpha1.ClusterAPINodeClass{
		"machine mode, new": {ObjectMeta: metav1.ObjectMeta{Name: "m"}},
		"machinedeployment mode, new": {ObjectMeta: metav1.ObjectMeta{Name: "md"},
			Spec: v1alpha1.ClusterAPINodeClassSpec{ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}}},
		"machine mode, reconciled": {ObjectMeta: metav1.ObjectMeta{Name: "m2"},
			Status: v1alpha1.ClusterAPINodeClassStatus{Conditions: []status.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}}},
	} {
		t.Run(name, func(t *testing.T) {
			writes := 0
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(nc).WithStatusSubresource(nc).
				WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
					writes++
					return c.SubResource(sub).Patch(ctx, o, p, opts...)
				}}).Build()
			ctrl := NewController(c, nil)
			if _, err := ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: nc.Name}}); err != nil {
				t.Fatal(err)
			}
			if writes != 0 {
				got := &v1alpha1.ClusterAPINodeClass{}
				_ = c.Get(context.Background(), client.ObjectKeyFromObject(nc), got)
				t.Fatalf("%d status write(s); conditions now %v", writes, got.Status.Conditions)
			}
		})
	}
}
