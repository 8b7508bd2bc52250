package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/world"
)

// fieldManager owns what the demo applies.
const fieldManager = "karpenter-clusterapi-demo"

// applyManifests server-side applies examples/demo: hub.yaml to the
// management cluster, then workload.yaml to the workload cluster.
func applyManifests(ctx context.Context, w *world.World, dir string) error {
	for _, f := range []struct {
		file string
		c    client.Client
	}{{"hub.yaml", w.Hub.Client}, {"workload.yaml", w.Spoke.Client}} {
		objs, err := readObjects(filepath.Join(dir, f.file))
		if err != nil {
			return err
		}
		for _, o := range objs {
			if err := apply(ctx, f.c, o); err != nil {
				return fmt.Errorf("%s: %s %s: %w", f.file, o.GetKind(), o.GetName(), err)
			}
		}
	}
	return nil
}

// apply retries for a few seconds: right after the start an API server may
// not serve a CRD's kind to a fresh client yet.
func apply(ctx context.Context, c client.Client, o *unstructured.Unstructured) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner(fieldManager), client.ForceOwnership)
		return last == nil, nil
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}
