package ec2sim

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// ec2Namespace is the XML namespace of EC2's API version the SDK asks for.
const ec2Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// apiError is an error answer: HTTP status, error code and message, as the
// service returns them (EC2: 400 for client errors, 500 for server errors
// such as insufficient capacity, which the SDK retries).
type apiError struct {
	status        int
	code, message string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func clientError(code, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, message: fmt.Sprintf(format, args...)}
}

// ServeHTTP routes a request to Secrets Manager (JSON, X-Amz-Target) or EC2
// (form-encoded Query protocol).
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := requestID()
	if target := r.Header.Get("X-Amz-Target"); target != "" {
		s.serveJSON(w, id, target, body)
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		writeEC2Error(w, id, clientError("MalformedQueryString", "%v", err))
		return
	}
	action := form.Get("Action")
	s.count(action)
	handler, ok := ec2Actions[action]
	if !ok {
		s.mu.Lock()
		s.unknown[action]++
		s.mu.Unlock()
		writeEC2Error(w, id, clientError("InvalidAction", "The action %s is not valid for this web service.", action))
		return
	}
	out, aerr := handler(s, form)
	if aerr != nil {
		writeEC2Error(w, id, aerr)
		return
	}
	writeEC2(w, action, id, out)
}

func (s *Sim) count(action string) {
	s.mu.Lock()
	s.calls[action]++
	s.mu.Unlock()
}

// writeEC2 writes <ActionResponse xmlns=...><requestId/>...</ActionResponse>;
// out is a struct whose fields carry their EC2 XML names.
func writeEC2(w http.ResponseWriter, action, id string, out any) {
	var buf bytes.Buffer
	root := xml.StartElement{Name: xml.Name{Local: action + "Response"}, Attr: []xml.Attr{{Name: xml.Name{Local: "xmlns"}, Value: ec2Namespace}}}
	if err := xml.NewEncoder(&buf).EncodeElement(out, root); err != nil {
		writeEC2Error(w, id, &apiError{status: http.StatusInternalServerError, code: "InternalError", message: err.Error()})
		return
	}
	doc := buf.String()
	i := strings.Index(doc, ">") + 1
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+`%s<requestId>%s</requestId>%s`, doc[:i], id, doc[i:])
}

func writeEC2Error(w http.ResponseWriter, id string, e *apiError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.status)
	var msg strings.Builder
	_ = xml.EscapeText(&msg, []byte(e.message))
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+`<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>%s</RequestID></Response>`,
		e.code, msg.String(), id)
}

// serveJSON answers the JSON 1.1 protocol (Secrets Manager).
func (s *Sim) serveJSON(w http.ResponseWriter, id, target string, body []byte) {
	service, op, _ := strings.Cut(target, ".")
	s.count(op)
	var out any
	var aerr *apiError
	switch {
	case service == "secretsmanager" && op == "CreateSecret":
		out, aerr = s.createSecret(body)
	case service == "secretsmanager" && op == "DeleteSecret":
		out, aerr = s.deleteSecret(body)
	case service == "secretsmanager" && op == "GetSecretValue":
		out, aerr = s.getSecretValue(body)
	default:
		s.mu.Lock()
		s.unknown[target]++
		s.mu.Unlock()
		aerr = clientError("UnknownOperationException", "unknown operation %s", target)
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-Requestid", id)
	if aerr != nil {
		w.WriteHeader(aerr.status)
		_ = json.NewEncoder(w).Encode(map[string]string{"__type": aerr.code, "message": aerr.message})
		return
	}
	_ = json.NewEncoder(w).Encode(out)
}

// Query protocol helpers.

// list returns prefix.1, prefix.2, ... values.
func list(form url.Values, prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := form[prefix+"."+strconv.Itoa(i)]
		if !ok {
			return out
		}
		out = append(out, v...)
	}
}

// filter is one Filter.N of a Describe call.
type filter struct {
	name   string
	values []string
}

func filters(form url.Values) []filter {
	var out []filter
	for i := 1; ; i++ {
		p := "Filter." + strconv.Itoa(i)
		name := form.Get(p + ".Name")
		if name == "" {
			return out
		}
		out = append(out, filter{name: name, values: list(form, p+".Value")})
	}
}

// tagsOf reads prefix.N.Key / prefix.N.Value pairs.
func tagsOf(form url.Values, prefix string) map[string]string {
	out := map[string]string{}
	for i := 1; ; i++ {
		p := prefix + "." + strconv.Itoa(i)
		k, ok := form[p+".Key"]
		if !ok {
			return out
		}
		out[k[0]] = form.Get(p + ".Value")
	}
}

// matchValue matches EC2 filter values, with * and ? wildcards.
func matchValue(values []string, v string) bool {
	for _, pat := range values {
		if wildcard(pat, v) {
			return true
		}
	}
	return false
}

func wildcard(pat, s string) bool {
	if pat == "" {
		return s == ""
	}
	switch pat[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if wildcard(pat[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && wildcard(pat[1:], s[1:])
	default:
		return s != "" && s[0] == pat[0] && wildcard(pat[1:], s[1:])
	}
}

// xTag is an EC2 tag in XML.
type xTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

func xTags(m map[string]string) []xTag {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]xTag, 0, len(keys))
	for _, k := range keys {
		out = append(out, xTag{Key: k, Value: m[k]})
	}
	return out
}
