package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// fieldOwner is the field manager of the dry-run applies.
const fieldOwner = "manifests-test"

// decode splits a multi-document YAML stream into objects, skipping empty
// documents (comments only).
func decode(data []byte) ([]*unstructured.Unstructured, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		obj := map[string]any{}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, fmt.Errorf("document %d is not a Kubernetes object (no apiVersion or kind)", i)
		}
		out = append(out, u)
	}
}

// applyDryRun applies obj to the cluster with server-side apply and
// dry-run: the API server runs defaulting, schema and CEL validation and
// admission, and stores nothing. Namespaced objects without a namespace go to
// defaultNamespace; a namespace the object names must exist.
func applyDryRun(c *environment.Cluster, obj *unstructured.Unstructured, defaultNamespace string) error {
	obj = obj.DeepCopy()
	mapping, err := c.Client.RESTMapper().RESTMapping(obj.GroupVersionKind().GroupKind(), obj.GroupVersionKind().Version)
	if err != nil {
		return fmt.Errorf("%s: the %s API server does not serve it: %w", describe(obj), c.Name, err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(defaultNamespace)
		}
	} else if obj.GetNamespace() != "" {
		return fmt.Errorf("%s: cluster-scoped, yet it names namespace %q", describe(obj), obj.GetNamespace())
	}
	body, err := obj.MarshalJSON()
	if err != nil {
		return err
	}
	// Strict: an unknown or duplicate field is an error, as with kubectl,
	// not a warning and a silently dropped field.
	err = c.Client.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, body),
		client.FieldOwner(fieldOwner), client.ForceOwnership, client.DryRunAll, client.FieldValidation("Strict"))
	if err != nil {
		return fmt.Errorf("%s on the %s API server: %w", describe(obj), c.Name, err)
	}
	return nil
}

// ensureNamespace creates a namespace if it does not exist yet.
func ensureNamespace(t *testing.T, c *environment.Cluster, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s on the %s API server: %v", name, c.Name, err)
	}
}

func describe(obj *unstructured.Unstructured) string {
	name := obj.GetName()
	if obj.GetNamespace() != "" {
		name = obj.GetNamespace() + "/" + name
	}
	return fmt.Sprintf("%s %s", obj.GetKind(), name)
}

func readCRD(path string) (*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		return nil, fmt.Errorf("decoding CRD %s: %w", path, err)
	}
	return crd, nil
}

// kinds counts objects by kind, for assertions on a rendering.
func kinds(objs []*unstructured.Unstructured) map[string]int {
	out := map[string]int{}
	for _, o := range objs {
		out[o.GetKind()]++
	}
	return out
}

// find returns the objects of a kind.
func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// lines joins output for error messages, trimmed.
func lines(b []byte) string { return strings.TrimSpace(string(b)) }
