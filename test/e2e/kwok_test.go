package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// Karpenter's own kwok provider (sigs.k8s.io/karpenter/kwok, built from the
// karpenter module this repository requires) is the floor of the bench: it
// creates Nodes itself after its KWOKNodeClass's registration delay, with no
// infrastructure and no Cluster API. The world's simulated kubelet makes
// those Nodes Ready and runs their Pods (test/world/kwok.go).

const (
	karpenterModule = "sigs.k8s.io/karpenter"
	kwokGroup       = "karpenter.kwok.sh"
	kwokNodeClass   = "KWOKNodeClass"
)

var (
	kwokOnce sync.Once
	kwokBin  string
	kwokErr  error
)

// buildKWOK builds core's kwok binary once per test binary, into the
// directory of the provider binary (removed at the end of the run).
func buildKWOK() (string, error) {
	kwokOnce.Do(func() {
		out := filepath.Join(filepath.Dir(bin), "karpenter-kwok")
		cmd := exec.Command("go", "build", "-o", out, karpenterModule+"/kwok")
		cmd.Dir = environment.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			kwokErr = fmt.Errorf("building Karpenter's kwok provider: %w: %s", err, msg)
			return
		}
		kwokBin = out
	})
	return kwokBin, kwokErr
}

// karpenterDir is the karpenter module's directory in the module cache.
func karpenterDir() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", karpenterModule)
	cmd.Dir = environment.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating %s: %w", karpenterModule, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// installKWOKCRD installs the KWOKNodeClass CRD in the world's spoke.
func installKWOKCRD() error {
	dir, err := karpenterDir()
	if err != nil {
		return err
	}
	_, err = envtest.InstallCRDs(w.Spoke.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(dir, "kwok", "apis", "crds")}, ErrorIfPathMissing: true,
	})
	if err != nil {
		return fmt.Errorf("installing the KWOKNodeClass CRD: %w", err)
	}
	return nil
}

// kwokInstanceTypes writes the kwok provider's instance types file: the
// world's m5.large (2 CPUs, 8 GiB) on demand in each of the world's zones at
// the price the bench's MachineDeployments and templates carry, so that
// core's scheduler weighs the same choice for every contender.
func kwokInstanceTypes(dir string, zones []string, price float64) (string, error) {
	type requirement struct {
		Key      string   `json:"key"`
		Operator string   `json:"operator"`
		Values   []string `json:"values"`
	}
	type offering struct {
		Price        float64
		Available    bool
		Requirements []requirement
	}
	var offerings []offering
	for _, z := range zones {
		offerings = append(offerings, offering{Price: price, Available: true, Requirements: []requirement{
			{Key: karpv1.CapacityTypeLabelKey, Operator: "In", Values: []string{karpv1.CapacityTypeOnDemand}},
			{Key: corev1.LabelTopologyZone, Operator: "In", Values: []string{z}},
		}})
	}
	types := []map[string]any{{
		"name": "m5.large", "architecture": "amd64", "operatingSystems": []string{"linux"},
		"resources": map[string]string{"cpu": "2", "memory": "8Gi", "pods": "110", "ephemeral-storage": "20Gi"},
		"offerings": offerings,
	}}
	raw, err := json.Marshal(types)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kwok-instance-types.json")
	return path, os.WriteFile(path, raw, 0o644)
}

// startKWOK starts core's kwok provider against the world's spoke.
func startKWOK(logName, instanceTypes string, env ...string) (*Provider, error) {
	b, err := buildKWOK()
	if err != nil {
		return nil, err
	}
	// The kwok binary registers no --kubeconfig flag (core's flag set would
	// panic on it): controller-runtime reads KUBECONFIG.
	env = append([]string{"KUBECONFIG=" + w.SpokeKubeconfig, "INSTANCE_TYPES_FILE_PATH=" + instanceTypes}, env...)
	return startKarpenter(b, filepath.Join(w.Dir, logName), nil, env)
}

// kwokPool creates a KWOKNodeClass with the registration delay and a
// NodePool shaped like the other contenders' (on-demand, Linux,
// consolidation after 5 s, budget 100 %); cleanup removes both.
func kwokPool(ctx context.Context, name string, delay time.Duration) (cleanup func(), err error) {
	nc := &unstructured.Unstructured{}
	nc.SetAPIVersion(kwokGroup + "/v1alpha1")
	nc.SetKind(kwokNodeClass)
	nc.SetName(name)
	if err := unstructured.SetNestedField(nc.Object, delay.String(), "spec", "nodeRegistrationDelay"); err != nil {
		return nil, err
	}
	np := benchNodePool(name, karpv1.NodeClassReference{Group: kwokGroup, Kind: kwokNodeClass, Name: name})
	for _, o := range []client.Object{nc, np} {
		if err := w.Spoke.Client.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("creating %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, name, err)
		}
	}
	return func() {
		_ = w.Spoke.Client.Delete(context.Background(), np)
		_ = w.Spoke.Client.Delete(context.Background(), nc)
	}, nil
}

// benchNodePool is the NodePool every contender of the bench uses.
func benchNodePool(name string, ref karpv1.NodeClassReference) *karpv1.NodePool {
	return &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{
				Spec: karpv1.NodeClaimTemplateSpec{
					NodeClassRef: &ref,
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
				Budgets:             []karpv1.Budget{{Nodes: "100%"}},
			},
		},
	}
}
