package broker

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/npurun/npurun/wire"
)

// sendInParts sends items in as many replies as their size takes, each
// made by reply from its part, more telling whether parts follow; key is
// the JSON name of the reply's field that holds the part ("rows").
func sendInParts[T any](c *conn, items []T, key string, reply func(part []T, more bool) *wire.Reply) error {
	return encodeInParts(items, key, func(part []T, more bool) any { return reply(part, more) }, c.sendRaw)
}

// encodeInParts is sendInParts on send. Each item is marshalled once: its
// encoding both measures it and goes into the message, where the reply
// made without the part holds "key":null. The message is, byte for byte,
// what json.Marshal makes of the reply with the part (a slice is its
// elements' encodings, comma-separated, in brackets).
func encodeInParts[T any](items []T, key string, reply func(part []T, more bool) any, send func([]byte) error) error {
	null := []byte(`"` + key + `":null`)
	for {
		var encoded [][]byte
		size := 1024
		for len(encoded) < len(items) && size < wire.MaxMessage/2 {
			b, err := json.Marshal(&items[len(encoded)])
			if err != nil {
				return err
			}
			encoded = append(encoded, b)
			size += len(b) + 1
		}
		n := len(encoded)
		part := items[:n]
		items = items[n:]
		more := len(items) > 0
		var data []byte
		var err error
		if n == 0 {
			data, err = json.Marshal(reply(part, more)) // nothing to put in: the reply as it is
		} else {
			data, err = splice(reply(nil, more), null, encoded)
		}
		if err != nil {
			return err
		}
		if err := send(data); err != nil {
			return err
		}
		if !more {
			return nil
		}
	}
}

// splice marshals msg, whose field null ("rows":null) is the one place
// of the part, with encoded in that place as a JSON array. A quote inside
// a JSON string is escaped, so null matches a field's name only.
func splice(msg any, null []byte, encoded [][]byte) ([]byte, error) {
	head, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	at := bytes.Index(head, null)
	if at < 0 || bytes.Contains(head[at+len(null):], null) {
		return nil, fmt.Errorf("reply has not one %s for its part", null)
	}
	size := len(head) + len(encoded) + 1
	for _, b := range encoded {
		size += len(b)
	}
	out := make([]byte, 0, size)
	out = append(out, head[:at+len(null)-len("null")]...)
	out = append(out, '[')
	for i, b := range encoded {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, b...)
	}
	out = append(out, ']')
	return append(out, head[at+len(null):]...), nil
}
