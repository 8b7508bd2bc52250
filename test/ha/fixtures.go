package ha

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Mode is how a pool launches nodes.
type Mode string

// The two modes of the product.
const (
	MachineMode           Mode = "Machine"
	MachineDeploymentMode Mode = "MachineDeployment"
)

// Every Machine of a pool, in either mode, carries the label pool=<name>
// (Machine mode: the NodeClass's Machine metadata; MachineDeployment mode:
// the MachineDeployment's Machine template), so one selector counts them.
const poolLabel = "pool"

// PoolOptions shape a pool.
type PoolOptions struct {
	Mode Mode
	// InstanceTypes offered, each with its price (default m5.large at 0.096).
	InstanceTypes map[string]string
	// Zone of MachineDeployments (MachineDeployment mode; default none).
	Zone string
	// Budget of the NodePool's disruption (default 100%).
	Budget string
	// OnDelete gives MachineDeployments the OnDelete rollout strategy that
	// docs/concepts.md recommends (default: the webhook's RollingUpdate,
	// whose surge Machine is a Machine without a NodeClaim during a drift).
	OnDelete bool
}

// Pool creates a pool: in Machine mode a NodeClass selecting member
// AWSMachineTemplates labelled pool=<name> and one template per instance
// type; in MachineDeployment mode a NodeClass selecting MachineDeployments
// labelled pool=<name> and one MachineDeployment (at 0 replicas) per type.
// Then its NodePool. It returns the objects created, for Delete.
func Pool(ctx context.Context, w *world.World, name string, o PoolOptions) ([]client.Object, []client.Object, error) {
	if len(o.InstanceTypes) == 0 {
		o.InstanceTypes = map[string]string{"m5.large": "0.096"}
	}
	if o.Budget == "" {
		o.Budget = "100%"
	}
	var hubObjs []client.Object
	nc := &v1alpha1.ClusterAPINodeClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for it, price := range o.InstanceTypes {
		objName := fmt.Sprintf("%s-%s", name, dns(it))
		tmpl := world.AWSMachineTemplate(w.Namespace, objName, it, false)
		tmpl.Annotations = map[string]string{v1alpha1.PriceAnnotation: price}
		if o.Mode == MachineMode {
			tmpl.Labels = map[string]string{v1alpha1.KarpenterMemberLabel: "", poolLabel: name, clusterv1.ClusterNameLabel: w.ClusterName}
		}
		if err := createTemplate(ctx, w, tmpl); err != nil {
			return nil, nil, err
		}
		hubObjs = append(hubObjs, tmpl)
		if o.Mode == MachineDeploymentMode {
			md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
				Namespace: w.Namespace, Name: objName, ClusterName: w.ClusterName, Member: true,
				Labels: map[string]string{poolLabel: name}, TemplateLabels: map[string]string{poolLabel: name},
				Annotations: map[string]string{v1alpha1.PriceAnnotation: price}, FailureDomain: o.Zone,
			})
			if o.OnDelete {
				md.Spec.Rollout.Strategy.Type = clusterv1.OnDeleteMachineDeploymentStrategyType
			}
			if err := w.Hub.Client.Create(ctx, md); err != nil {
				return nil, nil, fmt.Errorf("creating MachineDeployment %s: %w", objName, err)
			}
			hubObjs = append(hubObjs, md)
		}
	}
	if o.Mode == MachineMode {
		nc.Spec.MachineTemplate = &v1alpha1.MachineTemplate{
			InfrastructureTemplates: v1alpha1.InfrastructureTemplates{
				APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachineTemplate",
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{poolLabel: name}},
			},
			Bootstrap: v1alpha1.Bootstrap{DataSecretName: &w.BootstrapSecretName},
			Metadata:  v1alpha1.MachineMetadata{Labels: map[string]string{poolLabel: name}},
		}
	} else {
		nc.Spec.ScalableResourceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{poolLabel: name}}
	}
	np := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{
				Spec: karpv1.NodeClaimTemplateSpec{
					NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: name},
					Requirements: []karpv1.NodeSelectorRequirementWithMinValues{
						{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}},
						{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}},
					},
					ExpireAfter: karpv1.MustParseNillableDuration("Never"),
				},
			},
			Disruption: karpv1.Disruption{
				ConsolidationPolicy: karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized,
				ConsolidateAfter:    karpv1.MustParseNillableDuration("5s"),
				Budgets:             []karpv1.Budget{{Nodes: o.Budget}},
			},
		},
	}
	spokeObjs := []client.Object{nc, np}
	for _, obj := range spokeObjs {
		if err := w.Spoke.Client.Create(ctx, obj); err != nil {
			return nil, nil, fmt.Errorf("creating %T %s: %w", obj, name, err)
		}
	}
	return hubObjs, spokeObjs, nil
}

func createTemplate(ctx context.Context, w *world.World, t *infrav1.AWSMachineTemplate) error {
	status := t.Status
	if err := w.Hub.Client.Create(ctx, t); err != nil {
		return fmt.Errorf("creating AWSMachineTemplate %s: %w", t.Name, err)
	}
	t.Status = status
	if err := w.Hub.Client.Status().Update(ctx, t); err != nil {
		return fmt.Errorf("writing the status of AWSMachineTemplate %s: %w", t.Name, err)
	}
	return nil
}

func dns(s string) string {
	out := []byte(s)
	for i, c := range out {
		if c == '.' {
			out[i] = '-'
		}
	}
	return string(out)
}

// Deployment creates a Deployment of pause pods of the pool (node selector
// karpenter.sh/nodepool=<pool>), each requesting cpu.
func Deployment(ctx context.Context, w *world.World, pool, name string, replicas int32, cpu string) (*appsv1.Deployment, error) {
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{karpv1.NodePoolLabelKey: pool},
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "app", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
					}},
				},
			},
		},
	}
	if err := w.Spoke.Client.Create(ctx, d); err != nil {
		return nil, fmt.Errorf("creating Deployment %s: %w", name, err)
	}
	return d, nil
}

// Scale sets a Deployment's replicas.
func Scale(ctx context.Context, w *world.World, d *appsv1.Deployment, replicas int32) error {
	cur := &appsv1.Deployment{}
	if err := w.Spoke.Client.Get(ctx, client.ObjectKeyFromObject(d), cur); err != nil {
		return err
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Replicas = &replicas
	return w.Spoke.Client.Patch(ctx, cur, patch)
}
