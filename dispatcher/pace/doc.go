// Package pace paces a program's own calls to a rate-limited API, without NATS or
// Redis: Pacer hands out start times at an even rate, and Transport is an
// http.RoundTripper that sends requests at that rate, slows down when the API's
// RateLimit fields say its quota runs low and pauses on 429 or 503 (Retry-After).
// WithShared takes the starts from a schedule shared between processes (package
// pace/redispace keeps one in Redis). The dispatchers of package dispatcher pace
// their deliveries with its Pacer (go doc ./dispatcher: Pacing, Pacing client).
package pace
