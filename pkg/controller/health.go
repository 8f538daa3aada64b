package controller

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
)

// check is one named health check; nil means healthy.
type check struct {
	name string
	fn   func(*http.Request) error
}

// checks is a set of health checks served as one endpoint, in the style of
// the API server's /healthz: 200 "ok", or 500 listing each check ("[+]name
// ok" / "[-]name failed: reason"). ?verbose lists them on success too.
type checks struct {
	mu   sync.RWMutex
	list []check
}

func (c *checks) add(name string, fn func(*http.Request) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, check{name: name, fn: fn})
}

func (c *checks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.RLock()
	list := append([]check(nil), c.list...)
	c.mu.RUnlock()
	var b strings.Builder
	failed := false
	for _, ch := range list {
		if err := ch.fn(r); err != nil {
			failed = true
			fmt.Fprintf(&b, "[-]%s failed: %v\n", ch.name, err)
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", ch.name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if failed {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "%shealth check failed\n", b.String())
		return
	}
	if _, verbose := r.URL.Query()["verbose"]; verbose {
		fmt.Fprintf(w, "%sok\n", b.String())
		return
	}
	fmt.Fprint(w, "ok")
}
