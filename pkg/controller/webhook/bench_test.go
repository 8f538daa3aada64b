package webhook

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// concurrency is the number of admissions in flight at once.
const concurrency = 50

// BenchmarkAdmission50 sends AdmissionReviews to the handler over HTTPS,
// 50 at a time over kept-alive connections (as the API server does), and
// reports the latency percentiles a client sees: p50-µs and p99-µs.
//
//	go test ./pkg/controller/webhook -run '^$' -bench Admission50 -benchtime 20000x
func BenchmarkAdmission50(b *testing.B) {
	cases := map[string][]byte{
		// A claim with a config for the driver and one for another driver.
		"valid-claim": reviewJSON(b, admissionv1.Create, claimsGVR,
			claim(opaque("nic.example.com", otherDriverJunk, "nic"), opaque(driver, validMigMPS, "gpu")), nil),
		// Rejected: the message is built from the field errors.
		"invalid-claim": reviewJSON(b, admissionv1.Create, claimsGVR,
			claim(opaque(driver, invalidMPS150, "gpu")), nil),
		// No config for the driver: decoded and admitted.
		"other-driver-template": reviewJSON(b, admissionv1.Create, templatesGVR,
			template(opaque("nic.example.com", otherDriverJunk, "nic")), nil),
	}
	for _, name := range []string{"valid-claim", "invalid-claim", "other-driver-template"} {
		b.Run(name, func(b *testing.B) { benchmarkConcurrent(b, cases[name]) })
	}
}

func benchmarkConcurrent(b *testing.B, body []byte) {
	srv := httptest.NewUnstartedServer(NewHandler(driver, nil))
	srv.EnableHTTP2 = true
	// Closing the server mid-handshake of a spare connection is no news.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = concurrency
	url := srv.URL + Path

	send := func() error {
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Errorf("HTTP %d", resp.StatusCode)
		}
		return err
	}
	// Warm up: open the connections and finish the TLS handshakes.
	var warm sync.WaitGroup
	for range concurrency {
		warm.Go(func() {
			if err := send(); err != nil {
				b.Error(err)
			}
		})
	}
	warm.Wait()

	latencies := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range concurrency {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				start := time.Now()
				if err := send(); err != nil {
					b.Error(err)
					return
				}
				latencies[i] = time.Since(start)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds())
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admissions/s")
}

// BenchmarkHandler is the handler's own cost per admission, without TLS,
// HTTP or a client: the CPU time a replica spends on one review.
func BenchmarkHandler(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"valid-claim", reviewJSON(b, admissionv1.Create, claimsGVR,
			claim(opaque("nic.example.com", otherDriverJunk, "nic"), opaque(driver, validMigMPS, "gpu")), nil)},
		{"invalid-claim", reviewJSON(b, admissionv1.Create, claimsGVR, claim(opaque(driver, invalidMPS150, "gpu")), nil)},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := NewHandler(driver, nil)
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(c.body)))
				if rec.Code != http.StatusOK {
					b.Fatalf("HTTP %d", rec.Code)
				}
			}
		})
	}
}

// BenchmarkHandlerWorstCase is one admission of a claim with 32 configs,
// each a worst case of the API's hostile corpus at the size limit: the
// cost one request can put on a replica.
//
//	go test ./pkg/controller/webhook -run '^$' -bench HandlerWorstCase
func BenchmarkHandlerWorstCase(b *testing.B) {
	corpus, _, _ := readHostileCorpus(b)
	for _, name := range []string{"deep-arrays.json", "deep-objects.json", "long-array.json", "many-unknown-keys.json", "many-per-device-keys.json"} {
		configs := make([]resourceapi.DeviceClaimConfiguration, 32)
		for i := range configs {
			configs[i] = opaque(driver, string(corpus[name]), "gpu")
		}
		body := reviewJSON(b, admissionv1.Create, claimsGVR, claim(configs...), nil)
		b.Run("32x-"+strings.TrimSuffix(name, ".json"), func(b *testing.B) {
			h := NewHandler(driver, nil)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
				if rec.Code != http.StatusOK {
					b.Fatalf("HTTP %d", rec.Code)
				}
			}
		})
	}
}
