package v1alpha1

import "testing"

func TestMachineRefReadsBothForms(t *testing.T) {
	for _, c := range []struct {
		what        string
		annotations map[string]string
		ns, name    string
		ok          bool
	}{
		{"Cluster API's form", map[string]string{MachineAnnotation: "m1", MachineNamespaceAnnotation: "team-a"}, "team-a", "m1", true},
		{"earlier versions' form", map[string]string{MachineAnnotation: "team-a/m1"}, "team-a", "m1", true},
		{"earlier form wins over a namespace beside it", map[string]string{MachineAnnotation: "team-a/m1", MachineNamespaceAnnotation: "other"}, "team-a", "m1", true},
		{"a name without its namespace", map[string]string{MachineAnnotation: "m1"}, "", "m1", false},
		{"no annotation", map[string]string{MachineNamespaceAnnotation: "team-a"}, "team-a", "", false},
		{"empty namespace in the earlier form", map[string]string{MachineAnnotation: "/m1"}, "", "m1", false},
		{"a path, not a name", map[string]string{MachineAnnotation: "a/b/c"}, "a", "b/c", false},
	} {
		ns, name, ok := MachineRef(c.annotations)
		if ok != c.ok || (ok && (ns != c.ns || name != c.name)) {
			t.Errorf("%s: MachineRef(%v) = %q, %q, %v; want %q, %q, %v", c.what, c.annotations, ns, name, ok, c.ns, c.name, c.ok)
		}
	}
	a := map[string]string{}
	SetMachineRef(a, "team-a", "m1")
	if ns, name, ok := MachineRef(a); !ok || ns != "team-a" || name != "m1" {
		t.Errorf("SetMachineRef then MachineRef = %q, %q, %v", ns, name, ok)
	}
}
