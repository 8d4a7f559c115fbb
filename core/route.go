package idem

import (
	"fmt"
	"time"
)

// RouteOption sets one route's policy in [WithRoute].
type RouteOption func(*routePolicy)

// routeKey names a route for [WithRoute].
type routeKey struct{ method, route string }

// routePolicy is what the engine applies to one route's requests: the
// engine's own options, overridden by the route's [RouteOption]s.
type routePolicy struct {
	lease, retention       time.Duration
	leaseSet, retentionSet bool // given by RouteLease, RouteRetention
	fingerprint            Fingerprinter
	fingerprintSet         bool     // given by RouteFingerprint
	recover, recoverSet    bool     // RouteRecovery, WithRecovery
	recoverHeaders         []string // request header names kept for recovery, canonical
}

// WithRoute sets the policy of one route, so that routes with other needs
// share one engine: method (e.g. "POST") and route template exactly as the
// adapter reports it in [Request.Route] (the framework's syntax, e.g.
// "/v1/exports/:id" on Gin, "/v1/exports/{id}" on net/http; the path when
// the adapter reports no template). What opts leave unset follows the
// engine's options. Calls add up; for the same route, a later option wins.
// Optional. Default is the engine's options for every route.
//
//	idem.WithRoute("POST", "/v1/exports", idem.RouteLease(2*time.Minute), idem.RouteRetention(time.Hour))
func WithRoute(method, route string, opts ...RouteOption) Option {
	return func(c *config) {
		if c.routes == nil {
			c.routes = map[routeKey]*routePolicy{}
		}
		k := routeKey{method, route}
		p := c.routes[k]
		if p == nil {
			p = &routePolicy{}
			c.routes[k] = p
		}
		for _, o := range opts {
			o(p)
		}
	}
}

// RouteLease sets the route's lease ([WithLease]'s rules, floor included:
// at least 4 × the store timeout, else [New] returns an error); its
// renewal runs every lease/3. Default is the engine's [WithLease].
func RouteLease(d time.Duration) RouteOption {
	return func(p *routePolicy) { p.lease, p.leaseSet = d, true }
}

// RouteRetention sets how long the route's completed responses are
// replayed ([WithRetention]'s rules; > 0, else [New] returns an error).
// Default is the engine's [WithRetention].
func RouteRetention(d time.Duration) RouteOption {
	return func(p *routePolicy) { p.retention, p.retentionSet = d, true }
}

// RouteFingerprint sets the route's fingerprint function (see
// [WithFingerprint]); the engine knows it in stored records of every route
// ([WithKnownFingerprints]). Default is the engine's [WithFingerprint].
func RouteFingerprint(f Fingerprinter) RouteOption {
	return func(p *routePolicy) { p.fingerprint, p.fingerprintSet = f, true }
}

// validateRoutes checks every route's options as the engine's own and
// fills what they leave unset from the engine's; c's own options are
// already valid.
func (c *config) validateRoutes() error {
	for k, p := range c.routes {
		switch {
		case !p.leaseSet:
			p.lease = c.lease
		case p.lease <= 0:
			return fmt.Errorf("idem: WithRoute(%q, %q): lease must be > 0", k.method, k.route)
		case p.lease < leaseFloorFactor*c.storeTimeout:
			return fmt.Errorf("idem: WithRoute(%q, %q): lease %v is below its floor %v (%d × the store timeout %v): "+
				"it could lapse before a renewal lands and let a duplicate execute; raise RouteLease or lower WithStoreTimeout",
				k.method, k.route, p.lease, leaseFloorFactor*c.storeTimeout, leaseFloorFactor, c.storeTimeout)
		}
		switch {
		case !p.retentionSet:
			p.retention = c.retention
		case p.retention <= 0:
			return fmt.Errorf("idem: WithRoute(%q, %q): retention must be > 0", k.method, k.route)
		}
		if !p.fingerprintSet {
			p.fingerprint = c.fingerprint
		}
		if !p.recoverSet {
			p.recover, p.recoverHeaders = c.recover, c.recoverHeaders
		}
	}
	c.policy = routePolicy{lease: c.lease, retention: c.retention, fingerprint: c.fingerprint, recover: c.recover, recoverHeaders: c.recoverHeaders}
	return nil
}

// route returns the policy of a route: its [WithRoute] one, else the
// engine's.
func (e *Engine) route(method, route string) *routePolicy {
	if len(e.cfg.routes) > 0 {
		if p, ok := e.cfg.routes[routeKey{method, route}]; ok {
			return p
		}
	}
	return &e.cfg.policy
}
