// Package console tests the operator console (gateway/console) in a real
// headless browser: Debian's chromium, driven over the DevTools protocol
// with chromedp, against a full lockgate in front of the embedded FerretDB.
// chromedp is a test-only dependency: nothing outside _test files imports
// it, so the production binary does not link it.
package console
