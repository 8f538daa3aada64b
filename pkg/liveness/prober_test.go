package liveness

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// probe returns the status and body of GET path?verbose.
func probe(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path+"?verbose", nil))
	return rec.Code, rec.Body.String()
}

// A check that hangs fails readiness in the first round and liveness only
// after the threshold, is never called twice while hung, and passes again
// once released; the responses name checks, never the reasons.
func TestProberHungCheck(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	hang := atomic.Bool{}
	// The timeout is generous: a healthy check must answer within it on a
	// loaded machine; only the hung one reaches it.
	p, err := New(Options{Timeout: time.Second, Period: 2 * time.Second, FailureThreshold: 3, Checks: []Check{
		{Name: "ok", Run: func(context.Context) error { return nil }},
		{Name: "wedged", Run: func(context.Context) error {
			calls.Add(1)
			if hang.Load() {
				<-release
				return errors.New("secret detail")
			}
			return nil
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler()
	ctx := context.Background()
	if code, _ := probe(t, h, ReadyPath); code != http.StatusInternalServerError {
		t.Errorf("ready before the first round: %d, want 500", code)
	}
	if code, _ := probe(t, h, LivePath); code != http.StatusOK {
		t.Errorf("live before the first round: %d, want 200", code)
	}
	p.round(ctx)
	for _, path := range []string{ReadyPath, LivePath, "/healthz"} {
		if code, body := probe(t, h, path); code != http.StatusOK {
			t.Errorf("%s healthy: %d %s", path, code, body)
		}
	}

	hang.Store(true)
	for round := 1; round <= 3; round++ {
		p.round(ctx)
		code, body := probe(t, h, ReadyPath)
		if code != http.StatusInternalServerError || !strings.Contains(body, "[-]wedged failed") || !strings.Contains(body, "[+]ok ok") {
			t.Errorf("round %d: ready %d %s, want 500 naming wedged", round, code, body)
		}
		code, body = probe(t, h, LivePath)
		if wantLive := round < 3; (code == http.StatusOK) != wantLive {
			t.Errorf("round %d: live %d %s, want ok=%v", round, code, body, wantLive)
		}
		if strings.Contains(body, "secret") || strings.Contains(body, "no answer") {
			t.Errorf("the probe reveals a reason: %s", body)
		}
	}
	if n := calls.Load(); n != 2 { // one healthy call, one hung
		t.Errorf("%d calls of the check, want 2: a hung call is not repeated", n)
	}

	close(release) // the hung call returns its (stale) error; the next round calls afresh
	hang.Store(false)
	// Wait for the hung call to return: a round that starts before it has
	// (a loaded machine may delay its goroutine) reuses it, as it should.
	p.mu.Lock()
	hung := p.state["wedged"].running
	p.mu.Unlock()
	select {
	case <-hung.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the hung call did not return after its release")
	}
	p.round(ctx)
	for _, path := range []string{ReadyPath, LivePath} {
		if code, body := probe(t, h, path); code != http.StatusOK {
			t.Errorf("%s after release: %d %s", path, code, body)
		}
	}
}

// Run rounds on its own; a prober whose rounds stop fails liveness.
func TestProberRunAndStall(t *testing.T) {
	p, err := New(Options{Period: 10 * time.Millisecond, Timeout: 5 * time.Millisecond, FailureThreshold: 1,
		Checks: []Check{{Name: "ok", Run: func(context.Context) error { return nil }}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for code, _ := probe(t, p.Handler(), ReadyPath); code != http.StatusOK; code, _ = probe(t, p.Handler(), ReadyPath) {
		if time.Now().After(deadline) {
			t.Fatal("not ready within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	time.Sleep(30 * time.Millisecond) // past threshold × period + timeout
	if code, body := probe(t, p.Handler(), LivePath); code == http.StatusOK || !strings.Contains(body, "[-]probe-rounds failed") {
		t.Errorf("live with stopped rounds: %d %s, want probe-rounds failed", code, body)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	run := func(context.Context) error { return nil }
	for name, opts := range map[string]Options{
		"negative period":     {Period: -time.Second},
		"timeout over period": {Period: time.Second, Timeout: 2 * time.Second},
		"negative threshold":  {FailureThreshold: -1},
		"unnamed check":       {Checks: []Check{{Run: run}}},
		"duplicate check":     {Checks: []Check{{Name: "a", Run: run}, {Name: "a", Run: run}}},
		"check without func":  {Checks: []Check{{Name: "a"}}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(opts); err == nil {
				t.Errorf("New(%+v) accepted", opts)
			}
		})
	}
}

// Passing is nil only after a recent round in which the named checks
// passed; a failed check, a stale round or an unknown name is an error.
func TestProberPassing(t *testing.T) {
	var fail atomic.Bool
	p, err := New(Options{Period: time.Second, Timeout: time.Second, Checks: []Check{
		{Name: "a", Run: func(context.Context) error { return nil }},
		{Name: "b", Run: func(context.Context) error {
			if fail.Load() {
				return errors.New("b broke")
			}
			return nil
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Passing("a"); err == nil {
		t.Error("passing before the first round")
	}
	p.round(ctx)
	if err := p.Passing("a", "b"); err != nil {
		t.Errorf("healthy round: %v", err)
	}
	if err := p.Passing("c"); err == nil || !strings.Contains(err.Error(), `"c"`) {
		t.Errorf("unknown check: %v", err)
	}
	fail.Store(true)
	p.round(ctx)
	if err := p.Passing("a"); err != nil {
		t.Errorf("a passed: %v", err)
	}
	if err := p.Passing("a", "b"); err == nil || !strings.Contains(err.Error(), "b broke") {
		t.Errorf("b failed: %v", err)
	}
	fail.Store(false)
	p.round(ctx)
	p.mu.Lock()
	p.lastRound = time.Now().Add(-4 * time.Second) // rounds stopped
	p.mu.Unlock()
	if err := p.Passing("a"); err == nil || !strings.Contains(err.Error(), "no round") {
		t.Errorf("stale round: %v", err)
	}
}
