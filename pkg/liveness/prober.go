// Package liveness answers the kubelet's liveness and readiness probes of
// the plugin from checks of its serving path: the DRA and registration
// sockets answer, NVML answers. A Prober runs the checks in the background,
// each bounded by a timeout and with at most one call of a check
// outstanding, so that a hung call (a wedged NVML) is a failed check, never
// a hung probe handler or a pile of goroutines. Readiness fails on the first
// failed round; liveness only after FailureThreshold consecutive ones, so a
// slow NVML under load does not get the plugin restarted.
package liveness

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
)

// Check is one thing the probes depend on.
type Check struct {
	// Name names the check in the probe's verbose output ("dra-socket").
	Name string
	// Run returns nil when the thing answers. It should return by ctx's
	// deadline; the Prober stops waiting then either way, and does not
	// call it again before the call returned.
	Run func(ctx context.Context) error
}

// Options configure a Prober. Zero values take the defaults below (the
// timeout at most the period).
type Options struct {
	Checks []Check
	// Period is the time between two rounds of checks.
	Period time.Duration
	// Timeout bounds each round: a check that has not answered by then failed.
	Timeout time.Duration
	// FailureThreshold is how many consecutive rounds a check must fail
	// before liveness fails.
	FailureThreshold int
}

// Defaults of Options.
const (
	DefaultPeriod           = 10 * time.Second
	DefaultTimeout          = 5 * time.Second
	DefaultFailureThreshold = 3
)

// Prober runs the checks and keeps their results for the probes.
type Prober struct {
	opts Options

	mu sync.Mutex
	// state per check, by name.
	state map[string]*checkState
	// lastRound is when the latest round ended; zero before the first.
	lastRound time.Time
}

type checkState struct {
	err      error // of the latest round
	failures int   // consecutive failed rounds
	// running is the outstanding call, nil when none.
	running *call
}

// call is one run of a check; done is closed when it returned with err.
type call struct {
	started time.Time
	done    chan struct{}
	err     error
}

// New returns a Prober of opts; it checks nothing until Run.
func New(opts Options) (*Prober, error) {
	if opts.Period == 0 {
		opts.Period = DefaultPeriod
	}
	if opts.Timeout == 0 {
		opts.Timeout = min(DefaultTimeout, opts.Period)
	}
	if opts.FailureThreshold == 0 {
		opts.FailureThreshold = DefaultFailureThreshold
	}
	switch {
	case opts.Period < 0:
		return nil, fmt.Errorf("probe period %s: must be positive", opts.Period)
	case opts.Timeout < 0 || opts.Timeout > opts.Period:
		return nil, fmt.Errorf("probe timeout %s: must be positive and at most the period %s", opts.Timeout, opts.Period)
	case opts.FailureThreshold < 0:
		return nil, fmt.Errorf("liveness failure threshold %d: must be positive", opts.FailureThreshold)
	}
	p := &Prober{opts: opts, state: map[string]*checkState{}}
	for _, c := range opts.Checks {
		if c.Name == "" || c.Run == nil || p.state[c.Name] != nil {
			return nil, fmt.Errorf("probe check %q: needs a unique name and a function", c.Name)
		}
		p.state[c.Name] = &checkState{}
	}
	return p, nil
}

// Run runs a round of checks at once and then every period, until ctx is
// canceled.
func (p *Prober) Run(ctx context.Context) {
	t := time.NewTicker(p.opts.Period)
	defer t.Stop()
	for {
		p.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round runs every check, waits for them until the timeout and records
// the results.
func (p *Prober) round(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	calls := make(map[string]*call, len(p.opts.Checks))
	p.mu.Lock()
	for _, c := range p.opts.Checks {
		calls[c.Name] = p.start(ctx, c)
	}
	p.mu.Unlock()

	errs := make(map[string]error, len(calls))
	for name, cl := range calls {
		select {
		case <-cl.done:
			errs[name] = cl.err
		case <-ctx.Done():
			// A call that answered while the round waited on a hung one
			// passed: select would pick between the two at random.
			select {
			case <-cl.done:
				errs[name] = cl.err
			default:
				errs[name] = fmt.Errorf("no answer within %s (running since %s)", p.opts.Timeout, cl.started.Format(time.RFC3339))
			}
		}
	}

	logger := klog.FromContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, err := range errs {
		st := p.state[name]
		if err == nil {
			if st.failures > 0 {
				logger.Info("Probe check passes again", "check", name, "failedRounds", st.failures)
			}
			st.failures = 0
		} else {
			st.failures++
			logger.Error(err, "Probe check failed", "check", name, "consecutiveFailures", st.failures, "livenessThreshold", p.opts.FailureThreshold)
		}
		st.err = err
	}
	p.lastRound = time.Now()
}

// start returns the outstanding call of c, or starts one. p.mu is held.
func (p *Prober) start(ctx context.Context, c Check) *call {
	st := p.state[c.Name]
	if st.running != nil {
		select {
		case <-st.running.done: // finished after the last round gave up on it
		default:
			return st.running // still hung: never a second call
		}
	}
	cl := &call{started: time.Now(), done: make(chan struct{})}
	st.running = cl
	go func() {
		defer close(cl.done)
		cl.err = c.Run(ctx)
	}()
	return cl
}

// ReadyChecks are the readiness checks: each fails while its check failed
// in the latest round, and before the first round.
func (p *Prober) ReadyChecks() []healthz.HealthChecker {
	out := make([]healthz.HealthChecker, 0, len(p.opts.Checks))
	for _, c := range p.opts.Checks {
		out = append(out, healthz.NamedCheck(c.Name, func(*http.Request) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.lastRound.IsZero() {
				return errors.New("not checked yet")
			}
			return p.state[c.Name].err
		}))
	}
	return out
}

// LiveChecks are the liveness checks: each fails once its check failed
// FailureThreshold consecutive rounds; "probe-rounds" fails when rounds
// stopped (the prober itself stuck).
func (p *Prober) LiveChecks() []healthz.HealthChecker {
	out := []healthz.HealthChecker{healthz.NamedCheck("probe-rounds", func(*http.Request) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		late := time.Duration(p.opts.FailureThreshold)*p.opts.Period + p.opts.Timeout
		if !p.lastRound.IsZero() && time.Since(p.lastRound) > late {
			return fmt.Errorf("no round of checks since %s", p.lastRound.Format(time.RFC3339))
		}
		return nil
	})}
	for _, c := range p.opts.Checks {
		out = append(out, healthz.NamedCheck(c.Name, func(*http.Request) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			if st := p.state[c.Name]; st.failures >= p.opts.FailureThreshold {
				return fmt.Errorf("failed %d consecutive rounds: %w", st.failures, st.err)
			}
			return nil
		}))
	}
	return out
}

// Passing returns nil when the named checks passed in the latest round and
// that round is recent (within two periods and a timeout): the heartbeat
// renews only then. A stuck prober, a check that failed or was never run,
// or an unknown name is an error that names it.
func (p *Prober) Passing(names ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastRound.IsZero() {
		return errors.New("not checked yet")
	}
	if late := 2*p.opts.Period + p.opts.Timeout; time.Since(p.lastRound) > late {
		return fmt.Errorf("no round of checks since %s", p.lastRound.Format(time.RFC3339))
	}
	for _, name := range names {
		st := p.state[name]
		if st == nil {
			return fmt.Errorf("no probe check %q", name)
		}
		if st.err != nil {
			return fmt.Errorf("check %s: %w", name, st.err)
		}
	}
	return nil
}
