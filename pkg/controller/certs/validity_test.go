package certs

import (
	"testing"
	"time"
)

// Certificates are backdated, but the backdating is not part of their
// lifetime: a short-lived certificate must not be due as soon as it is made
// (that rewrote the Secret on every reconcile, each write triggering the
// next), and each is renewed two thirds of its validity after issuance.
func TestRotationCountsValidityFromIssuance(t *testing.T) {
	for name, tc := range map[string]struct{ ca, cert time.Duration }{
		"seconds": {ca: 90 * time.Second, cert: 60 * time.Second},
		"minutes": {ca: 3 * time.Minute, cert: time.Minute},
		"days":    {ca: 300 * 24 * time.Hour, cert: 30 * 24 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, webhookConfig())
			f.cfg.CAValidity, f.cfg.CertValidity = tc.ca, tc.cert
			m := f.manager(t)
			after := reconcile(t, m)
			first := serving(t, m)
			writes := countWrites(f.client, "secrets")

			if want := min(tc.cert/3*2, resync); after < want-time.Second || after > want {
				t.Errorf("next check in %v, want two thirds of the serving validity (%v)", after, want)
			}
			if got, want := RotateAt(first), f.clock.Now().Add(tc.cert/3*2); !got.Equal(want) {
				t.Errorf("serving certificate due at %v, want %v", got, want)
			}
			f.clock.Step(time.Second)
			reconcile(t, m)
			if n := countWrites(f.client, "secrets"); n != writes {
				t.Fatalf("%d more Secret writes one second after issuance", n-writes)
			}
			f.clock.SetTime(RotateAt(first).Add(time.Second))
			reconcile(t, m)
			if serving(t, m).Equal(first) {
				t.Error("serving certificate not renewed after two thirds of its validity")
			}
		})
	}
}

// A serving certificate that is due when a new CA arrives is kept until the
// CA has propagated; meanwhile the manager waits for that, not one second.
func TestDueServingCertWaitsForNewCAWithoutPolling(t *testing.T) {
	f := newFixture(t, webhookConfig())
	m := f.manager(t)
	reconcile(t, m)
	oldCA := f.bundles(t)[0][0]
	f.clock.SetTime(RotateAt(oldCA).Add(-time.Hour))
	reconcile(t, m) // a fresh serving certificate of the old CA
	cur := serving(t, m)

	f.clock.SetTime(RotateAt(cur).Add(time.Second)) // past both CA and serving rotation
	after := reconcile(t, m)
	if b := f.bundles(t)[0]; len(b) != 2 {
		t.Fatalf("bundle has %d CAs, want the new one and the old one", len(b))
	}
	if !serving(t, m).Equal(cur) {
		t.Fatal("serving certificate moved to the new CA before it propagated")
	}
	if after < f.cfg.PropagationDelay-time.Second || after > f.cfg.PropagationDelay {
		t.Errorf("next check in %v, want the propagation delay %v", after, f.cfg.PropagationDelay)
	}
}
