// Package e2eusers runs the product against clusters written the way users
// write them: CAPA's published clusterctl templates and ClusterClass, read
// unchanged from the CAPA module in the module cache, rendered as
// `clusterctl generate cluster` renders them, changed only by the edits
// the docs name (the patch files under examples/capa-templates/), and
// applied to the hub of a world started with world.Options.Published.
package e2eusers

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cluster-api/cmd/clusterctl/client/yamlprocessor"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// CAPATemplate is the path of one of CAPA's published cluster templates
// ("" for cluster-template.yaml, else the flavour, e.g. "flatcar").
func CAPATemplate(flavour string) (string, error) {
	dir, err := environment.ModuleDir("sigs.k8s.io/cluster-api-provider-aws/v2")
	if err != nil {
		return "", err
	}
	name := "cluster-template.yaml"
	if flavour != "" {
		name = "cluster-template-" + flavour + ".yaml"
	}
	return filepath.Join(dir, "templates", name), nil
}

// Values are clusterctl variables, as in clusterctl's config file
// (~/.cluster-api/clusterctl.yaml: "NAME: value" lines).
type Values map[string]string

// LoadValues reads a clusterctl variables file.
func LoadValues(path string) (Values, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	v := Values{}
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	return v, nil
}

// With returns a copy with more variables.
func (v Values) With(kv ...string) Values {
	out := Values{}
	for k, x := range v {
		out[k] = x
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// Render renders a template file as `clusterctl generate cluster
// --target-namespace namespace` does: clusterctl's simple YAML processor
// substitutes the variables (honouring ${VAR:=default}) and fails on a
// variable without value or default; every object is put in namespace.
func Render(path string, values Values, namespace string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := yamlprocessor.NewSimpleProcessor()
	if _, err := p.GetVariables(raw); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out, err := p.Process(raw, func(name string) (string, error) {
		if v, ok := values[name]; ok {
			return v, nil
		}
		return "", fmt.Errorf("variable %q is not set", name)
	})
	if err != nil {
		return nil, fmt.Errorf("rendering %s: %w", path, err)
	}
	objs, err := utilyaml.ToUnstructured(out)
	if err != nil {
		return nil, fmt.Errorf("parsing the rendered %s: %w", path, err)
	}
	result := make([]*unstructured.Unstructured, 0, len(objs))
	for i := range objs {
		// Every kind of CAPA's cluster templates is namespaced.
		objs[i].SetNamespace(namespace)
		result = append(result, &objs[i])
	}
	return result, nil
}

// ApplyPatches applies the patches of a patch file (rendered with values)
// to the objects they name, as kustomize applies such patches to a
// generated file: each patch names its target by apiVersion, kind and
// metadata.name and is merged into it (JSON merge patch, RFC 7386: what
// kustomize does for custom resources). A patch without a target is an error.
func ApplyPatches(objs []*unstructured.Unstructured, patchFile string, values Values) error {
	patches, err := Render(patchFile, values, "")
	if err != nil {
		return err
	}
	for _, p := range patches {
		target := find(objs, p.GroupVersionKind(), p.GetName())
		if target == nil {
			return fmt.Errorf("%s: no %s %s %s to patch", patchFile, p.GetAPIVersion(), p.GetKind(), p.GetName())
		}
		p.SetNamespace(target.GetNamespace())
		patch, err := json.Marshal(p.Object)
		if err != nil {
			return err
		}
		doc, err := json.Marshal(target.Object)
		if err != nil {
			return err
		}
		merged, err := jsonpatch.MergePatch(doc, patch)
		if err != nil {
			return fmt.Errorf("%s: patching %s %s: %w", patchFile, p.GetKind(), p.GetName(), err)
		}
		target.Object = map[string]any{}
		if err := json.Unmarshal(merged, &target.Object); err != nil {
			return err
		}
	}
	return nil
}

func find(objs []*unstructured.Unstructured, gvk schema.GroupVersionKind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GroupVersionKind() == gvk && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Find returns the object of a kind (any version) whose name has the
// given suffix, or nil.
func Find(objs []*unstructured.Unstructured, kind, nameSuffix string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && strings.HasSuffix(o.GetName(), nameSuffix) {
			return o
		}
	}
	return nil
}

// ExampleFile is the path of a file under examples/.
func ExampleFile(rel string) string {
	return filepath.Join(environment.RepoRoot(), "examples", rel)
}
