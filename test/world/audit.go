package world

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// hubAuditPolicy logs the requests of AuditedGroup's users at level
// Metadata (who, verb, resource, object, request URI with its selectors,
// response code) and nothing else: the world's own traffic costs nothing.
const hubAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["` + AuditedGroup + `"]
- level: None
`

// auditConfiguration writes the audit policy into Dir and returns the
// hub API server's audit flags.
func (w *World) auditConfiguration() (func(*envtest.Environment), error) {
	policy := filepath.Join(w.Dir, "hub-audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(hubAuditPolicy), 0o600); err != nil {
		return nil, err
	}
	return func(env *envtest.Environment) {
		env.ControlPlane.GetAPIServer().Configure().
			Set("audit-policy-file", policy).
			Set("audit-log-path", w.HubAuditLog).
			Set("audit-log-mode", "blocking").
			Set("audit-log-format", "json")
	}, nil
}

// AuditEvent is what the hub's audit log records of one request (the
// fields of audit.k8s.io/v1 Event that tests read).
type AuditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// HubAudit reads the hub's audit log: every request of AuditedGroup's users
// so far, in the order the API server logged them.
func (w *World) HubAudit() ([]AuditEvent, error) {
	raw, err := os.ReadFile(w.HubAuditLog)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// A line still being written is read next time.
	raw = raw[:bytes.LastIndexByte(raw, '\n')+1]
	var out []AuditEvent
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", w.HubAuditLog, line, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}
