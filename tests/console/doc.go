// Package console holds the end-to-end tests of observability/idemui, the
// operator's console: a headless Chromium (Debian's /usr/bin/chromium,
// driven through chromedp) settles a crashed payment on real stores.
package console
