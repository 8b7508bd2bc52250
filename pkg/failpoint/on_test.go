//go:build failpoints

package failpoint

import "testing"

func TestParse(t *testing.T) {
	for v, want := range map[string]*spec{
		"md-bind": {step: "md-bind", n: 1}, "md-bind:3": {step: "md-bind", n: 3}, "machine": {step: "machine", n: 1},
		"": nil, "md-bind:0": nil, "md-bind:x": nil,
	} {
		got := parse(v)
		if (got == nil) != (want == nil) || (got != nil && (got.step != want.step || got.n != want.n)) {
			t.Errorf("parse(%q) = %+v, want %+v", v, got, want)
		}
	}
}
