package idem

import (
	"bytes"
	"context"
	"net/http"
	"unsafe"
)

// BeginHTTP is [Engine.Begin] for adapters of frameworks built on net/http
// (net/http, chi, Gin, Echo): it reads method, path, query, Content-Type and
// the idempotency key header lines from r, and when Begin consumed the body
// it sets r.Body to the same bytes, so the handler can still bind it. It
// answers like Begin; ctx is r.Context().
func (e *Engine) BeginHTTP(r *http.Request, route, principal string) (*Execution, *Response) {
	if !e.cfg.methods[r.Method] {
		return nil, nil
	}
	// The header names are canonical (WithHeader canonicalizes its name):
	// indexing r.Header is Get and Values without canonicalizing each name
	// again on every request.
	req := Request{
		Method:     r.Method,
		Route:      route,
		Path:       r.URL.Path,
		RawQuery:   r.URL.RawQuery,
		Keys:       r.Header[e.cfg.header],
		Principal:  principal,
		BodyReader: r.Body,
		Header:     r.Header,
	}
	if v := r.Header["Content-Type"]; len(v) > 0 {
		req.ContentType = v[0]
	}
	if v := r.Header[RecoveryHeader]; len(v) > 0 {
		req.Recovery = v[0]
	}
	if r.ContentLength >= 0 && r.Body != nil && r.Body != http.NoBody {
		req.bodyHint = r.ContentLength + 1
	}
	req.handBack = true
	x, resp := e.Begin(r.Context(), &req)
	if req.BodyReader == nil && r.Body != nil {
		b := req.handed
		if b == nil {
			b = &bodyBuffer{}
		}
		b.Reset(req.Body)
		r.Body = b
	}
	return x, resp
}

// bodyBuffer is the request body BeginHTTP hands back to the handler: the
// bytes Begin read (io.NopCloser(bytes.NewReader(body)) in one allocation).
type bodyBuffer struct{ bytes.Reader }

// bodyWith is a bodyBuffer with room for a body in the same allocation;
// A is a byte array.
type bodyWith[A any] struct {
	bodyBuffer
	room A
}

// newBodyBuffer returns a bodyBuffer and, for a body of n bytes that fits
// one of bodyWith's sizes (the largest array each of the 96, 128, 256 and
// 512-byte size classes holds), room for it in the same allocation.
func newBodyBuffer(n int64) (*bodyBuffer, []byte) {
	switch {
	case n <= 0:
	case n <= 56:
		return withRoom[[56]byte]()
	case n <= 88:
		return withRoom[[88]byte]()
	case n <= 216:
		return withRoom[[216]byte]()
	case n <= 472:
		return withRoom[[472]byte]()
	}
	return &bodyBuffer{}, nil
}

func withRoom[A any]() (*bodyBuffer, []byte) {
	p := new(bodyWith[A])
	return &p.bodyBuffer, unsafe.Slice((*byte)(unsafe.Pointer(&p.room)), unsafe.Sizeof(p.room))
}

// Close does nothing: the bytes are in memory.
func (*bodyBuffer) Close() error { return nil }

// WithInfo returns ctx carrying [Info] about x (its scoped key), for the
// handler, and, with a [Transactional] store, x's [Unit] (see
// [UnitFromContext]); the engine then completes or releases through it.
func (x *Execution) WithInfo(ctx context.Context) context.Context {
	if x.e.tx != nil && x.unit == nil {
		x.unit = x.e.tx.Unit(x.ev.Key, x.token)
	}
	x.info = Info{Key: x.ev.Key, unit: x.unit, engine: x.e, exec: x}
	x.infoCtx = infoCtx{Context: ctx, info: &x.info}
	return &x.infoCtx // held in x: no allocation
}

// RequestWithInfo returns a shallow copy of r whose context carries info,
// as r.WithContext(ContextWithInfo(r.Context(), info)) does, in one
// allocation instead of two. Adapters on net/http based frameworks use it
// to show middleware outside them a replay (Info{Replayed: true}).
func RequestWithInfo(r *http.Request, info Info) *http.Request {
	p := new(struct {
		req  http.Request
		ctx  infoCtx
		info Info
	})
	p.info = info
	p.ctx = infoCtx{Context: r.Context(), info: &p.info}
	p.req = *r.WithContext(&p.ctx) // WithContext is inlined: its copy stays on the stack
	return &p.req
}

// Capture returns what a net/http handler run by x is given: a
// CaptureWriter writing to w, and a shallow copy of r whose context is
// x.WithInfo(r.Context()), both in one allocation (NewCaptureWriter and
// r.WithContext make one each).
func (x *Execution) Capture(w http.ResponseWriter, r *http.Request) (*CaptureWriter, *http.Request) {
	p := &struct {
		cw  CaptureWriter
		req http.Request
	}{cw: CaptureWriter{ResponseWriter: w, x: x}}
	p.req = *r.WithContext(x.WithInfo(r.Context())) // WithContext is inlined: its copy stays on the stack
	x.cw = &p.cw
	return &p.cw, &p.req
}

// CaptureWriter is the http.ResponseWriter adapters on net/http wrap around
// the client's: every write and flush goes to the client at once (streams are
// not held back) and the status and body bytes are copied to the Execution.
// It implements http.Flusher and Unwrap for http.ResponseController.
//
// Once the execution answers instead of its handler ([Execution.Override]:
// a Step found an unknown outcome), the handler's first write sends idem's
// answer (409 "operation-uncertain") instead, and its later writes are
// dropped; a handler that wrote nothing gets that answer sent when the
// adapter ends the execution (Finish, Fail, Abort).
type CaptureWriter struct {
	http.ResponseWriter
	x        *Execution
	status   int
	override bool // idem's answer was sent in place of the handler's
}

// NewCaptureWriter returns a CaptureWriter writing to w for x, for an
// adapter that hands the handler x's Info some other way; [Execution.Capture]
// makes the writer and the request carrying the Info together.
func (x *Execution) NewCaptureWriter(w http.ResponseWriter) *CaptureWriter {
	x.cw = &CaptureWriter{ResponseWriter: w, x: x}
	return x.cw
}

// overridden reports whether the handler's writes are dropped: idem's
// answer went, or goes now, in their place. status is 0 before the
// first write.
func (w *CaptureWriter) overridden() bool {
	if w.override {
		return true
	}
	if w.status != 0 {
		return false
	}
	r := w.x.Override()
	if r == nil {
		return false
	}
	w.override, w.status = true, r.Status
	ResetHeader(w.Header(), w.x.outer)
	r.Send(w.ResponseWriter)
	return true
}

// ResetHeader makes h what it was when the execution began, outer
// ([Execution.OuterHeader]): the handler's lines are dropped before idem
// answers in its place ([Execution.Override]).
func ResetHeader(h, outer http.Header) {
	for k := range h {
		if v, ok := outer[k]; ok {
			h[k] = v
		} else {
			delete(h, k)
		}
	}
}

// Status returns the first final status written (1xx are skipped), 200 once
// the body was written without one, or 0 when nothing was written. The
// header is snapshotted for storage at that moment.
func (w *CaptureWriter) Status() int { return w.status }

// WriteHeader implements http.ResponseWriter.
func (w *CaptureWriter) WriteHeader(code int) {
	if code >= 200 && w.overridden() {
		return
	}
	if w.status == 0 && code >= 200 {
		w.status = code
		w.x.SnapshotHeader(w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *CaptureWriter) Write(p []byte) (int, error) {
	if w.overridden() {
		return len(p), nil
	}
	if w.status == 0 {
		w.status = http.StatusOK
		w.x.SnapshotHeader(w.Header())
	}
	n, err := w.ResponseWriter.Write(p)
	w.x.Write(p[:n])
	return n, err
}

// Flush sends buffered data to the client.
func (w *CaptureWriter) Flush() {
	if w.overridden() {
		return
	}
	if w.status == 0 {
		w.status = http.StatusOK
		w.x.SnapshotHeader(w.Header())
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *CaptureWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
