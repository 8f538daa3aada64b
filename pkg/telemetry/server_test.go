package telemetry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

func TestServeStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() { errCh <- Serve(ctx, "127.0.0.1:0", NewRegistry(NewDriverMetrics(""), nil), nil, Security{}) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-errCh:
		if err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if err := Serve(context.Background(), "127.0.0.1:-1", NewRegistry(nil, nil), nil, Security{}); err == nil {
		t.Error("Serve on an invalid address: no error")
	}
}

// TestServeCutsOffSlowClients: a client that never finishes its headers or
// its body loses the connection after the server's timeouts (tiny here).
func TestServeCutsOffSlowClients(t *testing.T) {
	defer func(h, r time.Duration) { readHeaderTimeout, requestTimeout = h, r }(readHeaderTimeout, requestTimeout)
	readHeaderTimeout, requestTimeout = 100*time.Millisecond, 200*time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) })
	srv := newServer(slow)
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	for name, send := range map[string]string{
		"unfinished headers": "GET /metrics HTTP/1.1\r\nHost: x\r\n",
		"unfinished body":    "POST /simulate/event HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nxid",
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			if _, err := io.WriteString(conn, send); err != nil {
				t.Fatal(err)
			}
			if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(io.Discard, conn)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the server still holds the connection")
			}
		})
	}
}
