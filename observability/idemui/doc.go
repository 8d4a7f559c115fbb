// Package idemui is idem's operator console: an [http.Handler] a service
// mounts on its admin router (or cmd/idemctl serve runs standalone) that
// shows the records of a store by state (in progress, lapsed, due for
// recovery, uncertain or parked, completed), one record with its journal
// of steps decoded and its stored answer, and lets an authenticated
// operator settle a record: resolve a step (done with its result, or not
// done), complete, release or evict it, each after a confirmation page
// and recorded in an audit log.
//
// It is read-only unless [WithWrites] is given; writes need an operator
// ([WithWrites]' hook, or a [WithToken] session), a same-origin request
// ([http.CrossOriginProtection]) and the confirmation page's form token.
// Pages are rendered on the server from embedded templates and a style
// sheet; the console runs no script and loads nothing from elsewhere.
//
// Listings page through the store's [idem.Lister] by cursor, a bounded
// number of calls a page, so they stay fast on a store of any size.
package idemui
