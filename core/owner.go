package idem

import (
	"crypto/rand"
	"os"
	"strconv"
	"strings"
)

// ownerPrefix returns the prefix of every lease token an engine makes:
// "host:pid:random.", so that an operator reading a record (cmd/idemctl)
// sees which host and process holds it. The host is cut to 63 bytes and
// stripped of ':' (the separator); random keeps two engines of one process
// apart.
func ownerPrefix() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	host = strings.ReplaceAll(host, ":", "_")
	if len(host) > 63 {
		host = host[:63]
	}
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + rand.Text() + "."
}

// TokenOwner returns the host and process id that made a lease token
// ([Record.Token]): an engine's tokens are "host:pid:random.counter". ok is
// false for a token of another form (an older engine's, or a store's own).
func TokenOwner(token string) (host string, pid int, ok bool) {
	host, rest, found := strings.Cut(token, ":")
	if !found || host == "" {
		return "", 0, false
	}
	p, _, found := strings.Cut(rest, ":")
	if !found {
		return "", 0, false
	}
	pid, err := strconv.Atoi(p)
	if err != nil || pid <= 0 {
		return "", 0, false
	}
	return host, pid, true
}
