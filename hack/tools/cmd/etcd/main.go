// Command etcd runs a single-member etcd for the local development cluster.
//
// It is a thin wrapper around go.etcd.io/etcd/server/v3/embed at the version that
// k8s.io/kubernetes requires, so the cluster needs no etcd release download.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

type config struct {
	dataDir     string
	listenURL   string
	peerURL     string
	noFsync     bool
	quotaBytes  int64
	logLevel    string
	startupWait time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dataDir, "data-dir", envOr("GDD_ETCD_DATA_DIR", "etcd-data"), "Directory for etcd data (env GDD_ETCD_DATA_DIR).")
	flag.StringVar(&cfg.listenURL, "listen-client-url", envOr("GDD_ETCD_LISTEN_CLIENT_URL", "http://127.0.0.1:2379"), "Client URL to serve (env GDD_ETCD_LISTEN_CLIENT_URL).")
	flag.StringVar(&cfg.peerURL, "listen-peer-url", envOr("GDD_ETCD_LISTEN_PEER_URL", "http://127.0.0.1:2380"), "Peer URL to serve (env GDD_ETCD_LISTEN_PEER_URL).")
	flag.BoolVar(&cfg.noFsync, "unsafe-no-fsync", os.Getenv("GDD_ETCD_UNSAFE_NO_FSYNC") == "true", "Skip fsync; faster, loses data on a host crash (env GDD_ETCD_UNSAFE_NO_FSYNC).")
	flag.Int64Var(&cfg.quotaBytes, "quota-backend-bytes", 2<<30, "Backend size quota in bytes.")
	flag.StringVar(&cfg.logLevel, "log-level", "warn", "etcd log level: debug, info, warn or error.")
	flag.DurationVar(&cfg.startupWait, "startup-timeout", time.Minute, "How long to wait for the server to become ready.")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		log.Fatalf("etcd: %v", err)
	}
}

func run(ctx context.Context, cfg config) error {
	client, err := url.Parse(cfg.listenURL)
	if err != nil {
		return fmt.Errorf("parse client URL %q: %w", cfg.listenURL, err)
	}
	peer, err := url.Parse(cfg.peerURL)
	if err != nil {
		return fmt.Errorf("parse peer URL %q: %w", cfg.peerURL, err)
	}

	ec := embed.NewConfig()
	ec.Name = "default"
	ec.Dir = cfg.dataDir
	ec.ListenClientUrls = []url.URL{*client}
	ec.AdvertiseClientUrls = []url.URL{*client}
	ec.ListenPeerUrls = []url.URL{*peer}
	ec.AdvertisePeerUrls = []url.URL{*peer}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.UnsafeNoFsync = cfg.noFsync
	ec.QuotaBackendBytes = cfg.quotaBytes
	ec.LogLevel = cfg.logLevel

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("start etcd in %s: %w", cfg.dataDir, err)
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		log.Printf("etcd ready, serving %s (data dir %s)", client, cfg.dataDir)
	case <-time.After(cfg.startupWait):
		e.Server.Stop()
		return fmt.Errorf("etcd not ready after %s", cfg.startupWait)
	case <-ctx.Done():
		return nil
	}

	select {
	case err := <-e.Err():
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("etcd serve: %w", err)
		}
		return nil
	case <-ctx.Done():
		log.Printf("etcd stopping: %v", context.Cause(ctx))
		return nil
	}
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}
