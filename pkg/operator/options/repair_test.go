package options

import (
	"strings"
	"testing"
	"time"
)

func TestParseRepairConditions(t *testing.T) {
	got, err := ParseRepairConditions(" KernelDeadlock=True:10m, example.com/Disk=False:90s ,")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Type != "KernelDeadlock" || got[0].Status != "True" || got[0].Toleration != 10*time.Minute ||
		got[1].Type != "example.com/Disk" || got[1].Status != "False" || got[1].Toleration != 90*time.Second {
		t.Fatalf("parsed %+v", got)
	}
	if got, err := ParseRepairConditions(""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v, %v", got, err)
	}
	for in, want := range map[string]string{
		"KernelDeadlock=True":      "is not <type>=<status>:<toleration>",
		"KernelDeadlock:10m":       "is not <type>=<status>:<toleration>",
		"Ready=False:1m":           "Ready is repaired already",
		"KernelDeadlock=Yes:1m":    `status "Yes"`,
		"KernelDeadlock=True:soon": `toleration "soon"`,
		"KernelDeadlock=True:-1m":  `toleration "-1m"`,
		"bad type=True:1m":         `condition type "bad type"`,
		"A=True:1m,A=True:2m":      "A=True is listed twice",
	} {
		if _, err := ParseRepairConditions(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, want)
		}
	}
}
