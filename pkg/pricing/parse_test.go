package pricing

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

const priceKey = "example.com/price"

func checkFieldError(t *testing.T, err *FieldError, key, value string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one for %q", value)
	}
	if err.Key != key || err.Value != value || err.Reason == "" {
		t.Errorf("FieldError = %#v, want Key %q, Value %q and a Reason", err, key, value)
	}
	prefix := "annotation " + strconv.Quote(key) + ": " + quote(value) + " "
	if !strings.HasPrefix(err.Error(), prefix) {
		t.Errorf("Error() = %q, want prefix %q", err.Error(), prefix)
	}
}

func TestParsePrice(t *testing.T) {
	good := []struct {
		value string
		want  float64
	}{
		{"0.096", 0.096},
		{"1.5", 1.5},
		{"1", 1},
		{"10", 10},
		{".5", 0.5},
		{"5.", 5},
		{"007.50", 7.5},
		{" 0.096 ", 0.096},
		{"\t1.5\n", 1.5},
		{"\u00a02\u00a0", 2},
		{"0.0000001", 1e-7},
		{"0." + strings.Repeat("0", 60) + "1", 1e-61},
		{"1000000", 1e6},
		{"1000000.000", 1e6},
		{"32.7726", 32.7726},
	}
	for _, tc := range good {
		t.Run("good/"+tc.value, func(t *testing.T) {
			got, err := ParsePrice(priceKey, tc.value)
			if err != nil {
				t.Fatalf("ParsePrice(%q) error: %v", tc.value, err)
			}
			if got != tc.want {
				t.Errorf("ParsePrice(%q) = %v, want %v", tc.value, got, tc.want)
			}
		})
	}

	bad := []struct {
		value  string
		reason string
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"free", "is not a decimal number"},
		{"-1", "must be greater than zero"},
		{"-0.5", "must be greater than zero"},
		{"0", "must be greater than zero"},
		{"0.0", "must be greater than zero"},
		{"000", "must be greater than zero"},
		{".", "is not a decimal number"},
		{"+1", "is not a decimal number"},
		{"NaN", "is not a decimal number"},
		{"nan", "is not a decimal number"},
		{"Inf", "is not a decimal number"},
		{"+Inf", "is not a decimal number"},
		{"-Inf", "is not a decimal number"},
		{"infinity", "is not a decimal number"},
		{"1e400", "is not a decimal number"},
		{"1e3", "is not a decimal number"},
		{"1E-3", "is not a decimal number"},
		{"0x1p-2", "is not a decimal number"},
		{"0x10", "is not a decimal number"},
		{"1_000", "is not a decimal number"},
		{"1,5", "is not a decimal number"},
		{"1.2.3", "is not a decimal number"},
		{"$1", "is not a decimal number"},
		{"1.5/h", "is not a decimal number"},
		{"1.5 USD", "is not a decimal number"},
		{"1 5", "is not a decimal number"},
		{"0.096x", "is not a decimal number"},
		{"x0.096", "is not a decimal number"},
		{"１.５", "is not a decimal number"}, // full-width digits
		{"1.5\x00", "is not a decimal number"},
		{"--1", "is not a decimal number"},
		{"1000000.1", "too large"},
		{strings.Repeat("9", 64), "too large"},
		{strings.Repeat("9", 65), "longer than"},
		{strings.Repeat("9", 400), "longer than"},
		{"0." + strings.Repeat("0", 70) + "1", "longer than"},
	}
	for _, tc := range bad {
		name := tc.value
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run("bad/"+name, func(t *testing.T) {
			got, err := ParsePrice(priceKey, tc.value)
			checkFieldError(t, err, priceKey, tc.value)
			if err != nil && !strings.Contains(err.Reason, tc.reason) {
				t.Errorf("Reason = %q, want it to contain %q", err.Reason, tc.reason)
			}
			if got != 0 {
				t.Errorf("got %v alongside an error", got)
			}
		})
	}
}

func TestParsePriceErrorMessage(t *testing.T) {
	_, err := ParsePrice(priceKey, "free")
	want := `annotation "example.com/price": "free" is not a decimal number like 0.096`
	if err == nil || err.Error() != want {
		t.Errorf("error = %v, want %s", err, want)
	}
	var nilErr *FieldError
	if nilErr.Error() != "<nil>" {
		t.Errorf("nil Error() = %q", nilErr.Error())
	}
}

func TestFieldErrorLongValue(t *testing.T) {
	value := strings.Repeat("€", 10000)
	_, err := ParsePrice(priceKey, value)
	checkFieldError(t, err, priceKey, value)
	if msg := err.Error(); len(msg) > 2000 || !strings.Contains(msg, "(30000 bytes)") || strings.Contains(msg, `\x`) {
		t.Errorf("Error() = %q", msg)
	}
}

func TestParsePriceResultIsFinitePositive(t *testing.T) {
	for _, v := range []string{"1", "0.0000000000000000000000000000000000000000000000000000000000001", "999999.999999"} {
		got, err := ParsePrice(priceKey, v)
		if err != nil || !(got > 0) || math.IsInf(got, 0) {
			t.Errorf("ParsePrice(%q) = %v, %v", v, got, err)
		}
	}
}
