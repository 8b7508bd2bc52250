// Package crds installs the CRDs the provider serves in the workload cluster
// (Karpenter's NodePool, NodeClaim and NodeOverlay, and the
// ClusterAPINodeClass) when --install-workload-crds is set: the topology where
// the provider runs in the management cluster and nobody else installs them
// in the workload cluster.
package crds

import (
	"context"
	"embed"
	"fmt"
	"path"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"
	"sigs.k8s.io/yaml"
)

// FieldManager owns the CRDs this package applies.
const FieldManager = "karpenter-clusterapi"

// bases is a copy of config/crd/bases made by `make generate` (go:embed
// cannot reach outside this directory); a test keeps the two equal.
//
//go:embed bases/*.yaml
var bases embed.FS

// establishTimeout bounds the wait for the API server to serve the CRDs.
const establishTimeout = time.Minute

// All returns the CRDs to install, as written in their YAML files: Karpenter
// core's NodePool, NodeClaim and NodeOverlay, then this provider's NodeClass.
func All() ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, raw := range [][]byte{karpapis.NodePoolCRD, karpapis.NodeClaimCRD, karpapis.NodeOverlayCRD} {
		crd, err := decode(raw)
		if err != nil {
			return nil, fmt.Errorf("decoding a Karpenter CRD: %w", err)
		}
		out = append(out, crd)
	}
	files, err := bases.ReadDir("bases")
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		raw, err := bases.ReadFile(path.Join("bases", f.Name()))
		if err != nil {
			return nil, err
		}
		crd, err := decode(raw)
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", f.Name(), err)
		}
		out = append(out, crd)
	}
	return out, nil
}

func decode(raw []byte) (*unstructured.Unstructured, error) {
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		return nil, err
	}
	if crd.GetKind() != "CustomResourceDefinition" || crd.GetName() == "" {
		return nil, fmt.Errorf("not a named CustomResourceDefinition (kind %q)", crd.GetKind())
	}
	return crd, nil
}

// Install creates or updates every CRD of All by server-side apply, taking
// over fields other managers set, and waits until the API server serves
// them all (Established), so informers started afterwards find their kinds.
func Install(ctx context.Context, cfg *rest.Config) error {
	crds, err := All()
	if err != nil {
		return err
	}
	s := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return err
	}
	for _, crd := range crds {
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(crd), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		if err := waitEstablished(ctx, c, crd.GetName()); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, c client.Client, name string) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, establishTimeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return false, nil //nolint:nilerr // retried until the timeout
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s is not Established after %s (conditions %v): %w", name, establishTimeout, crd.Status.Conditions, err)
	}
	return nil
}
