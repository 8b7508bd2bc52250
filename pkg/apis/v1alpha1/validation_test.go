package v1alpha1_test

import (
	"context"
	"os"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

var spoke *environment.Cluster

func TestMain(m *testing.M) {
	var err error
	if spoke, err = environment.StartSpoke(); err != nil {
		panic(err)
	}
	code := m.Run()
	_ = spoke.Stop()
	os.Exit(code)
}

func TestCRDValidation(t *testing.T) {
	secret := "bootstrap-data"
	templates := v1alpha1.InfrastructureTemplates{
		APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachineTemplate",
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "general"}},
	}
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "general"}}
	for _, tc := range []struct {
		name    string
		spec    v1alpha1.ClusterAPINodeClassSpec
		wantErr string
	}{
		{name: "machinedeployment-mode", spec: v1alpha1.ClusterAPINodeClassSpec{ScalableResourceSelector: selector}},
		{name: "machine-mode", spec: v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
			InfrastructureTemplates: templates, Bootstrap: v1alpha1.Bootstrap{DataSecretName: &secret}}}},
		{name: "neither", spec: v1alpha1.ClusterAPINodeClassSpec{},
			wantErr: "exactly one of spec.scalableResourceSelector (MachineDeployment mode) or spec.machineTemplate (Machine mode) must be set"},
		{name: "both", spec: v1alpha1.ClusterAPINodeClassSpec{ScalableResourceSelector: selector, MachineTemplate: &v1alpha1.MachineTemplate{
			InfrastructureTemplates: templates, Bootstrap: v1alpha1.Bootstrap{DataSecretName: &secret}}},
			wantErr: "exactly one of spec.scalableResourceSelector (MachineDeployment mode) or spec.machineTemplate (Machine mode) must be set"},
		{name: "bootstrap-both", spec: v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
			InfrastructureTemplates: templates, Bootstrap: v1alpha1.Bootstrap{DataSecretName: &secret,
				ConfigRef: &v1alpha1.TemplateReference{APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfigTemplate", Name: "w"}}}},
			wantErr: "exactly one of bootstrap.configRef or bootstrap.dataSecretName must be set"},
		{name: "bootstrap-neither", spec: v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
			InfrastructureTemplates: templates}},
			wantErr: "exactly one of bootstrap.configRef or bootstrap.dataSecretName must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := &v1alpha1.ClusterAPINodeClass{ObjectMeta: metav1.ObjectMeta{Name: tc.name}, Spec: tc.spec}
			err := spoke.Client.Create(context.Background(), nc)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("valid NodeClass rejected: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("invalid NodeClass accepted, want error %q", tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("want error containing %q, got %v", tc.wantErr, err)
			}
		})
	}
}
