// Command ferretdb is a tiny MongoDB-wire-compatible test server.
//
// MongoDB cannot be installed on the machines idem is developed and tested on,
// but FerretDB v1 with its SQLite backend speaks the MongoDB wire protocol and
// is a plain Go program. The stores/mongostore tests run against this server
// (and against a real MongoDB when IDEM_MONGO_URI is set).
//
// It keeps its data in a temporary directory that is removed on exit, serves
// in the foreground until SIGINT/SIGTERM, and prints exactly one line, the
// MongoDB URI (e.g. mongodb://127.0.0.1:27017/), to stdout once it accepts
// TCP connections. Use -addr 127.0.0.1:0 to pick a free port.
//
// This is a separate module, deliberately not in go.work:
//
//	cd tools/ferretdb && GOWORK=off go build -o ferretdb .
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:27017", "TCP `host:port` to listen on (port 0 picks a free port)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("ferretdb: ")

	dir, err := os.MkdirTemp("", "idem-ferretdb-")
	if err != nil {
		log.Fatal(err)
	}
	if err := run(*addr, dir); err != nil {
		os.RemoveAll(dir)
		log.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		log.Fatal(err)
	}
}

func run(addr, dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: addr},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Handler:   "sqlite",
		SQLiteURL: "file:" + dir + "/",
	})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	// New already bound the port (so :0 works); wait until it really accepts.
	uri := f.MongoDBURI()
	u, err := url.Parse(uri)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not accept connections: %w", u.Host, err)
		}
	}
	fmt.Println(uri)
	return <-done
}
