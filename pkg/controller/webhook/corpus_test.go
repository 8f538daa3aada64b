package webhook

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/hostile"
)

// hostileDir is the API's corpus of hostile configs; its _want.json says
// what DecodeDefaultValidate gives for each.
const hostileDir = "../../../api/gpu/v1beta1/testdata/hostile"

// caseDeadline bounds each admission: a bound against hangs, not a timing
// measurement (BenchmarkHandlerWorstCase measures).
const caseDeadline = 2 * time.Second

func readHostileCorpus(t testing.TB) (corpus map[string][]byte, rejected, accepted map[string]string) {
	t.Helper()
	corpus, want := hostile.Read(t, hostileDir)
	return corpus, want.Rejected, want.Accepted
}

// whitespaceOnlyOversized is over the size limit only by whitespace after
// the object, which is not part of the parameters once the review is
// decoded (nor once the API server has stored them).
const whitespaceOnlyOversized = "oversized-whitespace.json"

// placeholder stands for the parameters in a review, replaced by a corpus
// file's bytes as they are, so that the handler gets them unaltered.
const placeholder = `{"placeholder":true}`

// TestHostileCorpus sends every hostile config of the API's corpus to the
// handler as a claim's parameters: each is denied with the config's path
// and the decoder's message, or admitted on purpose; input that is not JSON
// (which the API server never sends: parameters must be a JSON object)
// gets 400; none panics or takes longer than caseDeadline.
func TestHostileCorpus(t *testing.T) {
	corpus, rejected, accepted := readHostileCorpus(t)
	template := reviewJSON(t, admissionv1.Create, claimsGVR, claim(opaque(driver, placeholder, "gpu")), nil)
	h := NewHandler(driver, nil)
	for _, name := range slices.Sorted(maps.Keys(corpus)) {
		t.Run(name, func(t *testing.T) {
			body := bytes.Replace(template, []byte(placeholder), corpus[name], 1)
			type result struct {
				code int
				resp *admissionv1.AdmissionResponse
			}
			r := hostile.Call(t, caseDeadline, "handler", func() result {
				code, resp, _ := post(t, h, body)
				return result{code: code, resp: resp}
			})
			if !json.Valid(body) {
				if r.code != http.StatusBadRequest {
					t.Errorf("HTTP %d for a review that is not JSON, want 400", r.code)
				}
				return
			}
			if r.code != http.StatusOK {
				t.Fatalf("HTTP %d, want 200", r.code)
			}
			if reason, ok := accepted[name]; ok || name == whitespaceOnlyOversized {
				if !ok {
					reason = "the parameters are the JSON value without the whitespace around it"
				}
				if !r.resp.Allowed {
					t.Errorf("denied with %q; want it admitted (%s)", r.resp.Result.Message, reason)
				}
				return
			}
			if r.resp.Allowed {
				t.Fatalf("admitted; want a denial with %q", rejected[name])
			}
			msg := r.resp.Result.Message
			const path = "spec.devices.config[0].opaque.parameters"
			if !strings.HasPrefix(msg, path) || !strings.Contains(msg, rejected[name]) {
				t.Errorf("denial %q does not start with %s and contain %q", msg, path, rejected[name])
			}
			if d := r.resp.Result.Details; d == nil || len(d.Causes) == 0 || !strings.HasPrefix(d.Causes[0].Field, path) {
				t.Errorf("denial's causes %+v do not name a field under %s", d, path)
			}
		})
	}
}
