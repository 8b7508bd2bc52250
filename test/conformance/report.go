package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Spec states in the report.
const (
	StatePassed  = "passed"
	StateFailed  = "failed"
	StateSkipped = "skipped"
)

// SpecResult is one spec's outcome in one mode.
type SpecResult struct {
	Mode  Mode   `json:"mode"`
	Suite string `json:"suite"`
	Group string `json:"group"`
	Spec  string `json:"spec"`
	// State is passed, failed or skipped.
	State   string  `json:"state"`
	Seconds float64 `json:"seconds"`
	// Message is the failure message, or why the spec skipped itself.
	Message string `json:"message,omitempty"`
	// Location is where a failure happened (file:line).
	Location string `json:"location,omitempty"`
}

// GroupResult is one group's run: its world and its suite process.
type GroupResult struct {
	Mode  Mode   `json:"mode"`
	Suite string `json:"suite"`
	Group string `json:"group"`
	// WorldSeconds is how long the world took to start (fleet included).
	WorldSeconds float64 `json:"worldSeconds"`
	Seconds      float64 `json:"seconds"`
	// Error is what went wrong outside the specs (world start, suite crash).
	Error string `json:"error,omitempty"`
	// Logs is the directory keeping the group's logs.
	Logs string `json:"logs,omitempty"`
}

// Report is the whole run, also written as JSON.
type Report struct {
	Started          time.Time     `json:"started"`
	Seconds          float64       `json:"seconds"`
	Commit           string        `json:"commit"`
	KarpenterVersion string        `json:"karpenterVersion"`
	Modes            []Mode        `json:"modes"`
	Groups           []GroupResult `json:"groups"`
	Specs            []SpecResult  `json:"specs"`
	Summary          Summary       `json:"summary"`
}

// Summary counts the specs.
type Summary struct {
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Skipped int `json:"skipped"`
}

// Line is the summary line.
func (s Summary) Line() string {
	return fmt.Sprintf("conformance: %d passed, %d failed, %d skipped", s.Passed, s.Failed, s.Skipped)
}

func summarize(specs []SpecResult) Summary {
	var s Summary
	for _, r := range specs {
		switch r.State {
		case StatePassed:
			s.Passed++
		case StateSkipped:
			s.Skipped++
		default:
			s.Failed++
		}
	}
	return s
}

// ginkgoReport is the part of ginkgo's JSON report (--ginkgo.json-report)
// read here: an array of suite reports.
type ginkgoReport struct {
	SuiteDescription string `json:"SuiteDescription"`
	SpecReports      []struct {
		ContainerHierarchyTexts []string      `json:"ContainerHierarchyTexts"`
		LeafNodeType            string        `json:"LeafNodeType"`
		LeafNodeText            string        `json:"LeafNodeText"`
		State                   string        `json:"State"`
		RunTime                 time.Duration `json:"RunTime"`
		Failure                 struct {
			Message  string `json:"Message"`
			Location struct {
				FileName   string `json:"FileName"`
				LineNumber int    `json:"LineNumber"`
			} `json:"Location"`
		} `json:"Failure"`
	} `json:"SpecReports"`
}

// ginkgoSpec is one It of a ginkgo report.
type ginkgoSpec struct {
	Text, State, Message, Location string
	RunTime                        time.Duration
}

// readGinkgoReport returns the Its of a ginkgo JSON report and its suite-level
// failures (BeforeSuite, AfterSuite).
func readGinkgoReport(path string) (specs []ginkgoSpec, suiteFailures []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, nil, fmt.Errorf("parsing ginkgo report %s: %w", path, err)
	}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			loc := ""
			if s.Failure.Location.FileName != "" {
				loc = fmt.Sprintf("%s:%d", trimModulePath(s.Failure.Location.FileName), s.Failure.Location.LineNumber)
			}
			if s.LeafNodeType != "It" {
				if s.State != "passed" && s.State != "skipped" && s.Failure.Message != "" {
					suiteFailures = append(suiteFailures, fmt.Sprintf("%s %s: %s (%s)", s.LeafNodeType, s.State, s.Failure.Message, loc))
				}
				continue
			}
			text := strings.Join(append(append([]string(nil), s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
			specs = append(specs, ginkgoSpec{Text: text, State: s.State, Message: s.Failure.Message, Location: loc, RunTime: s.RunTime})
		}
	}
	return specs, suiteFailures, nil
}

// trimModulePath shortens a source path to the part inside its module.
func trimModulePath(p string) string {
	if i := strings.Index(p, "/test/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

// normalizeState maps ginkgo's states onto passed, failed and skipped.
func normalizeState(s string) string {
	switch s {
	case "passed":
		return StatePassed
	case "skipped", "pending":
		return StateSkipped
	default: // failed, panicked, interrupted, aborted, timedout
		return StateFailed
	}
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// WriteText prints the per-spec table, the skip and failure reasons, and the
// summary line last.
func (r *Report) WriteText(out io.Writer) {
	specs := append([]SpecResult(nil), r.Specs...)
	sort.SliceStable(specs, func(i, j int) bool {
		a, b := specs[i], specs[j]
		if a.Mode != b.Mode {
			return a.Mode < b.Mode
		}
		if a.Suite != b.Suite {
			return a.Suite < b.Suite
		}
		return a.Group < b.Group
	})
	for _, s := range specs {
		fmt.Fprintf(out, "%-8s %7.1fs  %-17s %s/%s: %s\n", strings.ToUpper(s.State), s.Seconds, s.Mode, s.Suite, s.Group, s.Spec)
		if s.Message != "" && s.State != StatePassed {
			fmt.Fprintf(out, "         %s\n", indent(oneParagraph(s.Message, 600), "         "))
			if s.Location != "" && s.State == StateFailed {
				fmt.Fprintf(out, "         at %s\n", s.Location)
			}
		}
	}
	for _, g := range r.Groups {
		if g.Error != "" {
			fmt.Fprintf(out, "GROUP ERROR %s %s/%s: %s (logs %s)\n", g.Mode, g.Suite, g.Group, g.Error, g.Logs)
		}
	}
	for _, m := range r.Modes {
		fmt.Fprintf(out, "%s mode: %s\n", m, summarize(filterMode(r.Specs, m)).Line())
	}
	fmt.Fprintln(out, r.Summary.Line())
}

func filterMode(specs []SpecResult, m Mode) []SpecResult {
	var out []SpecResult
	for _, s := range specs {
		if s.Mode == m {
			out = append(out, s)
		}
	}
	return out
}

func oneParagraph(s string, max int) string {
	s = strings.TrimSpace(s)
	if len(s) > max {
		s = s[:max] + " …"
	}
	return s
}

func indent(s, prefix string) string {
	return strings.ReplaceAll(s, "\n", "\n"+prefix)
}
