package hostile

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf records the failure and ends the
// goroutine, as testing's does.
type recorder struct {
	testing.TB
	failure string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs Call on f in a goroutine of its own and returns its failure.
func fails(f func() int) (int, string) {
	r := &recorder{TB: nil}
	var got int
	done := make(chan struct{})
	go func() {
		defer close(done)
		got = Call(r, time.Second, "decode", f) // long enough for "returns" on a loaded machine
	}()
	<-done
	return got, r.failure
}

func TestCall(t *testing.T) {
	tests := map[string]struct {
		f       func() int
		want    int
		failure string
	}{
		"returns": {f: func() int { return 7 }, want: 7},
		"panics":  {f: func() int { panic("boom") }, failure: "decode panicked: boom"},
		"hangs":   {f: func() int { time.Sleep(5 * time.Second); return 1 }, failure: "decode did not return within 1s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, failure := fails(tc.f)
			if got != tc.want || !strings.Contains(failure, tc.failure) || (tc.failure == "") != (failure == "") {
				t.Errorf("Call = %d, failure %q; want %d, failure %q", got, failure, tc.want, tc.failure)
			}
		})
	}
}
