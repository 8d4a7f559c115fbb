package idem

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
)

// RetryCannotFix reports whether err, a client's failure to exchange a
// request with a server (no response came), is one that sending the same
// request again cannot fix, so that a client stops at once instead of
// waiting out its retry budget: the server's name does not resolve (DNS
// "no such host"), the server's TLS certificate fails verification, the
// TLS handshake gets a non-TLS record or the server's alert refusing the
// handshake itself (no common protocol or version, a client certificate
// refused or missing), or net/http refused the request
// itself (unsupported URL scheme, no host, invalid header field). Every
// other failure to connect or to get a response (refused, reset, EOF,
// timeout, a temporary DNS failure) is one a restarting server fixes, and
// is false. Errors that carry only a message (a gRPC status, a JSON-RPC
// error) are matched by the messages of those errors, as go-retryablehttp
// does for net/http's request errors. The idem clients (idemclient,
// idemgrpc, idemconnect, idemmcp) all decide by it.
func RetryCannotFix(err error) bool {
	if err == nil {
		return false
	}
	var (
		dns      *net.DNSError
		verify   *tls.CertificateVerificationError
		record   tls.RecordHeaderError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
	)
	if errors.As(err, &dns) {
		return dns.IsNotFound
	}
	if errors.As(err, &verify) || errors.As(err, &record) || errors.As(err, &unknown) ||
		errors.As(err, &invalid) || errors.As(err, &hostname) {
		return true
	}
	msg := err.Error()
	for _, permanent := range []string{
		"no such host", "x509: ", "tls: failed to verify", "server gave HTTP response to HTTPS client",
		// TLS alerts from a server that will refuse the same handshake again
		"tls: no application protocol", "tls: protocol version not supported", "tls: bad certificate",
		"tls: unknown certificate authority", "tls: certificate required",
		"unsupported protocol scheme", "no Host in request URL", "invalid header field", "nil Request.URL",
	} {
		if strings.Contains(msg, permanent) {
			return true
		}
	}
	return false
}
