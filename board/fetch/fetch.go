// Package fetch is the one way npurun's programs ask an npuboard for its
// JSON: npuboard its peers' /api/box, npubroker status --cluster each
// node's /api/status. A fetch is bounded in time and in size, follows no
// redirect, and says why it failed in words fit for a page or a table.
// It imports neither the board nor npubroker's client code, so that both
// can use it.
package fetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Defaults of a fetch: its time and size bounds.
const (
	DefaultTimeout = 2 * time.Second
	DefaultMax     = 4 << 20
)

// Client is an HTTP client for npuboards: it follows no redirect (an
// answer elsewhere is not the board's) and gives up after timeout.
func Client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// ErrTooBig is an answer over the size bound.
var ErrTooBig = errors.New("answer too large")

// ErrNotJSON is an answer that does not parse.
var ErrNotJSON = errors.New("answered what is not npuboard's JSON")

// JSON gets url with client within timeout and parses its answer, at most
// max bytes, into v.
func JSON(client *http.Client, url string, timeout time.Duration, max int64, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("no answer within %s", timeout)
		}
		return fmt.Errorf("unreachable: %w", errors.Unwrap(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", strconv.Quote(resp.Status))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("no whole answer within %s", timeout)
		}
		return fmt.Errorf("answer cut: %w", err)
	}
	if int64(len(body)) > max {
		return fmt.Errorf("%w: more than %d bytes", ErrTooBig, max)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return ErrNotJSON
	}
	return nil
}
