package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/idemkit/idem/adapters/idemwebhook"
	idem "github.com/idemkit/idem/core"
)

// receiver is the service's webhook side: one endpoint per sender, each
// verified by its scheme and deduplicated by event id through idemwebhook.
type receiver struct {
	engine     *idem.Engine
	stripe     *idemwebhook.Stripe
	billing    *idemwebhook.StandardWebhooks
	processing time.Duration

	mu        sync.Mutex
	processed map[string]int // "sender/event id" → times processed
}

func newReceiver(e *idem.Engine, processing time.Duration) (*receiver, error) {
	stripe, err := idemwebhook.NewStripe(stripeSecret)
	if err != nil {
		return nil, err
	}
	billing, err := idemwebhook.NewStandardWebhooks(billingSecret)
	if err != nil {
		return nil, err
	}
	return &receiver{engine: e, stripe: stripe, billing: billing, processing: processing, processed: map[string]int{}}, nil
}

// routes mounts the two endpoints. With Gin, Echo or Fiber, mount the same
// handlers with gin.WrapH, echo.WrapHandler or adaptor.HTTPHandler.
func (rc *receiver) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", idemwebhook.New(rc.engine, "stripe", rc.stripe)(http.HandlerFunc(rc.handle)))
	mux.Handle("POST /webhooks/billing", idemwebhook.New(rc.engine, "billing", rc.billing)(http.HandlerFunc(rc.handle)))
	return mux
}

// handle processes one verified event: here it marks the order paid
// (counted), taking rc.processing, and answers 200 with a receipt.
func (rc *receiver) handle(w http.ResponseWriter, r *http.Request) {
	d, _ := idemwebhook.DeliveryFromContext(r.Context())
	var event struct {
		Type string `json:"type"`
	}
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(body, &event)
	}
	if err != nil {
		http.Error(w, "not a JSON event", http.StatusBadRequest) // stored: redeliveries get the same 400
		return
	}
	time.Sleep(rc.processing) // the work: a database write, a call to the fulfilment service
	rc.mu.Lock()
	rc.processed[d.Sender+"/"+d.ID]++
	rc.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"received": d.ID, "type": event.Type, "at": time.Now().UTC().Format(time.RFC3339Nano)})
}

// report prints how often each event sent was processed and fails unless
// every one was processed exactly once.
func (rc *receiver) report(out io.Writer, sent []string) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	sort.Strings(sent)
	bad := 0
	for _, ev := range sent {
		n := rc.processed[ev]
		if n != 1 {
			bad++
		}
		fmt.Fprintf(out, "  %-40s processed %d time(s)\n", ev, n)
	}
	if bad > 0 || len(rc.processed) != len(sent) {
		return fmt.Errorf("%d of %d events not processed exactly once (%d processed in all)", bad, len(sent), len(rc.processed))
	}
	fmt.Fprintf(out, "%d events, each processed exactly once\n", len(sent))
	return nil
}
