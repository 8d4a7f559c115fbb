package outboxtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// faultProxy is an in-process toxiproxy proxy (the library, no API
// server) from a free loopback port to a broker, for faults between a
// relay and its broker: bytes dropped with the connections open, the
// connections closed and refused, then everything restored.
type faultProxy struct {
	t       testing.TB
	p       *toxiproxy.Proxy
	address string // p.Listen once started (toxiproxy rewrites it at every start)
}

func newFaultProxy(t testing.TB, upstream string) *faultProxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "outbox_"+strings.ToLower(rand.Text()[:8]), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &faultProxy{t: t, p: p, address: p.Listen}
}

// addr is where clients connect: host:port.
func (f *faultProxy) addr() string { return f.address }

// drop drops every byte both ways and keeps the connections open (a
// timeout toxic without timeout), as a network partition does.
func (f *faultProxy) drop() {
	f.t.Helper()
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name": "drop_%s", "type": "timeout", "stream": %q, "attributes": {"timeout": 0}}`, stream, stream)
		if _, err := f.p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			f.t.Fatal(err)
		}
	}
}

// close closes every connection and refuses new ones.
func (f *faultProxy) close() { f.p.Stop() }

// restore removes the toxics and accepts connections again, on the same
// port.
func (f *faultProxy) restore() {
	f.t.Helper()
	f.p.Toxics.ResetToxics(context.Background())
	if err := f.p.Start(); err != nil {
		f.t.Fatal(err)
	}
}
