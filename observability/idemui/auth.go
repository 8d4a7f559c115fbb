package idemui

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
	"unicode"
)

// sessionCookie is the cookie of a [WithToken] session: name "." HMAC.
const sessionCookie = "idemui_session"

// guard lets a request through when it needs no session (no [WithToken],
// the login page, the style sheet) or carries a valid one, and sends the
// others to the login page.
func (c *console) guard(h http.Handler) http.Handler {
	if c.cfg.token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := c.session(r); ok || r.URL.Path == "/login" || strings.HasPrefix(r.URL.Path, "/static/") {
			h.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodGet {
			redirect(w, r, "/login")
			return
		}
		http.Error(w, "idemui: log in first", http.StatusUnauthorized)
	})
}

// session returns the operator of the request's [WithToken] session.
func (c *console) session(r *http.Request) (string, bool) {
	if c.cfg.token == "" {
		return "", false
	}
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", false
	}
	name, sig, ok := strings.Cut(ck.Value, ".")
	if !ok || !validOperator(name) {
		return "", false
	}
	return name, hmac.Equal([]byte(sig), []byte(c.sessionSig(name)))
}

func (c *console) sessionSig(name string) string {
	mac := hmac.New(sha256.New, c.secret)
	mac.Write([]byte("session\x00" + name))
	return hex.EncodeToString(mac.Sum(nil))
}

// validOperator reports whether name is a usable operator's name: 1 to
// 64 letters, digits and . _ @ -.
func validOperator(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && !strings.ContainsRune("._@-", r) {
			return false
		}
	}
	return true
}

// operator returns who sends a write: the [WithWrites] hook's answer, or
// the [WithToken] session's operator.
func (c *console) operator(r *http.Request) (string, bool) {
	if c.cfg.auth != nil {
		return c.cfg.auth(r)
	}
	return c.session(r)
}

// viewer returns the operator reading a page, for its header: "" when
// unknown (reads need no operator unless [WithToken]).
func (c *console) viewer(r *http.Request) string {
	if name, ok := c.operator(r); ok {
		return name
	}
	return ""
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.token == "" {
		http.NotFound(w, r)
		return
	}
	c.render(w, r, "login", http.StatusOK, map[string]any{"Error": r.URL.Query().Get("error") != ""})
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.token == "" {
		http.NotFound(w, r)
		return
	}
	name, token := strings.TrimSpace(r.PostFormValue("operator")), r.PostFormValue("token")
	if !validOperator(name) || subtle.ConstantTimeCompare([]byte(token), []byte(c.cfg.token)) != 1 {
		c.cfg.logger.WarnContext(r.Context(), "idemui: login refused", "operator", name, "remote", r.RemoteAddr)
		redirect(w, r, "/login?error=1")
		return
	}
	// Secure over TLS only: a standalone console on 127.0.0.1 is plain HTTP.
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: name + "." + c.sessionSig(name), Path: base(r) + "/", //nolint:gosec // Secure over TLS, above
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	redirect(w, r, "/")
}

func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: base(r) + "/", MaxAge: -1, //nolint:gosec // deletes the cookie
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	redirect(w, r, "/login")
}
