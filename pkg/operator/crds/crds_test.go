package crds_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/operator/crds"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// The embedded copy must be what `make generate` wrote to config/crd/bases.
func TestEmbeddedNodeClassCRDsMatchConfig(t *testing.T) {
	want, err := filepath.Glob(filepath.Join(environment.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(want) == 0 {
		t.Fatalf("no CRDs in config/crd/bases: %v", err)
	}
	got, err := filepath.Glob("bases/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("pkg/operator/crds/bases has %d files, config/crd/bases %d: run 'make generate'", len(got), len(want))
	}
	for _, w := range want {
		a, errA := os.ReadFile(w)
		b, errB := os.ReadFile(filepath.Join("bases", filepath.Base(w)))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Errorf("pkg/operator/crds/bases/%s differs from config/crd/bases: run 'make generate' (%v %v)", filepath.Base(w), errA, errB)
		}
	}
}

// Install creates the CRDs in an empty API server, and brings an outdated one
// that another manager created up to date.
func TestInstallCreatesAndUpdates(t *testing.T) {
	ctx := context.Background()
	cluster, err := environment.Start("workload", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	s := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cluster.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}

	all, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range all {
		names = append(names, u.GetName())
	}
	for _, want := range []string{"nodepools.karpenter.sh", "nodeclaims.karpenter.sh", "nodeoverlays.karpenter.sh", "clusterapinodeclasses.karpenter.cluster.x-k8s.io"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Fatalf("CRD %s is not installed by --install-workload-crds, only %v", want, names)
		}
	}

	// An outdated NodeClass CRD: no printer columns, created by someone else.
	var outdated *apiextensionsv1.CustomResourceDefinition
	for _, u := range all {
		if u.GetName() != "clusterapinodeclasses.karpenter.cluster.x-k8s.io" {
			continue
		}
		outdated = &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, outdated); err != nil {
			t.Fatal(err)
		}
	}
	outdated.Spec.Versions[0].AdditionalPrinterColumns = nil
	if err := c.Create(ctx, outdated, client.FieldOwner("someone-else")); err != nil {
		t.Fatal(err)
	}

	for i := range 2 { // the second run finds everything in place
		if err := crds.Install(ctx, cluster.Config); err != nil {
			t.Fatalf("install #%d: %v", i+1, err)
		}
	}
	for _, n := range names {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: n}, crd); err != nil {
			t.Fatal(err)
		}
		established := false
		for _, cond := range crd.Status.Conditions {
			established = established || (cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue)
		}
		if !established {
			t.Errorf("CRD %s is not Established: %v", n, crd.Status.Conditions)
		}
		if n == outdated.Name && len(crd.Spec.Versions[0].AdditionalPrinterColumns) == 0 {
			t.Errorf("the outdated CRD %s was not updated", n)
		}
	}
}
